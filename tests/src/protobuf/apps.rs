//! k8s.io/api apps/v1: Deployment, as `kubectl create deployment` sends it.

use super::core::POD_TEMPLATE_SPEC;
use super::fields::Card::{Keep, Opt, Rep};
use super::fields::Ty::{Bool, Int, IntOrString, Msg, Str, Time};
use super::fields::{Field, LABEL_SELECTOR, OBJECT_META};

const ROLLING_UPDATE_DEPLOYMENT: &[Field] = &[
    Field(1, "maxUnavailable", IntOrString, Keep),
    Field(2, "maxSurge", IntOrString, Keep),
];
const DEPLOYMENT_STRATEGY: &[Field] = &[
    Field(1, "type", Str, Opt),
    Field(2, "rollingUpdate", Msg(ROLLING_UPDATE_DEPLOYMENT), Keep),
];
const DEPLOYMENT_SPEC: &[Field] = &[
    Field(1, "replicas", Int, Keep),
    Field(2, "selector", Msg(LABEL_SELECTOR), Keep),
    Field(3, "template", Msg(POD_TEMPLATE_SPEC), Opt),
    Field(4, "strategy", Msg(DEPLOYMENT_STRATEGY), Opt),
    Field(5, "minReadySeconds", Int, Opt),
    Field(6, "revisionHistoryLimit", Int, Keep),
    Field(7, "paused", Bool, Opt),
    Field(9, "progressDeadlineSeconds", Int, Keep),
];
const DEPLOYMENT_CONDITION: &[Field] = &[
    Field(1, "type", Str, Keep),
    Field(2, "status", Str, Keep),
    Field(6, "lastUpdateTime", Time, Opt),
    Field(7, "lastTransitionTime", Time, Opt),
    Field(4, "reason", Str, Opt),
    Field(5, "message", Str, Opt),
];
const DEPLOYMENT_STATUS: &[Field] = &[
    Field(1, "observedGeneration", Int, Opt),
    Field(2, "replicas", Int, Opt),
    Field(3, "updatedReplicas", Int, Opt),
    Field(7, "readyReplicas", Int, Opt),
    Field(4, "availableReplicas", Int, Opt),
    Field(5, "unavailableReplicas", Int, Opt),
    Field(6, "conditions", Msg(DEPLOYMENT_CONDITION), Rep),
    Field(8, "collisionCount", Int, Keep),
];
pub(super) const DEPLOYMENT: &[Field] = &[
    Field(1, "metadata", Msg(OBJECT_META), Opt),
    Field(2, "spec", Msg(DEPLOYMENT_SPEC), Opt),
    Field(3, "status", Msg(DEPLOYMENT_STATUS), Opt),
];
