//! k8s.io/api core/v1: the kinds kubectl's imperative `create` commands send (ConfigMap,
//! Secret, ServiceAccount, Namespace) and the pod template a Deployment embeds.
//!
//! `PodSpec` and `Container` list every field of the real messages: the scalars, maps and the
//! messages `kubectl create deployment` fills are decoded; the rest (volumes, probes, security
//! contexts, ...) are `Unsupported`, refused when present. All of those are pointers or lists,
//! which Go's protobuf encoding leaves out when unset, so kubectl's bodies never carry them.

use super::fields::Card::{Keep, Opt, Rep};
use super::fields::Field;
use super::fields::OBJECT_META;
use super::fields::Ty::{Bool, Int, MapBytes, MapQuantity, MapStr, Msg, Str, Time, Unsupported};

pub(super) const CONFIG_MAP: &[Field] = &[
    Field(1, "metadata", Msg(OBJECT_META), Opt),
    Field(2, "data", MapStr, Opt),
    Field(3, "binaryData", MapBytes, Opt),
    Field(4, "immutable", Bool, Keep),
];
pub(super) const SECRET: &[Field] = &[
    Field(1, "metadata", Msg(OBJECT_META), Opt),
    Field(2, "data", MapBytes, Opt),
    Field(3, "type", Str, Opt),
    Field(4, "stringData", MapStr, Opt),
    Field(5, "immutable", Bool, Keep),
];
const OBJECT_REFERENCE: &[Field] = &[
    Field(1, "kind", Str, Opt),
    Field(2, "namespace", Str, Opt),
    Field(3, "name", Str, Opt),
    Field(4, "uid", Str, Opt),
    Field(5, "apiVersion", Str, Opt),
    Field(6, "resourceVersion", Str, Opt),
    Field(7, "fieldPath", Str, Opt),
];
const LOCAL_OBJECT_REFERENCE: &[Field] = &[Field(1, "name", Str, Opt)];
pub(super) const SERVICE_ACCOUNT: &[Field] = &[
    Field(1, "metadata", Msg(OBJECT_META), Opt),
    Field(2, "secrets", Msg(OBJECT_REFERENCE), Rep),
    Field(3, "imagePullSecrets", Msg(LOCAL_OBJECT_REFERENCE), Rep),
    Field(4, "automountServiceAccountToken", Bool, Keep),
];
const NAMESPACE_CONDITION: &[Field] = &[
    Field(1, "type", Str, Keep),
    Field(2, "status", Str, Keep),
    Field(4, "lastTransitionTime", Time, Opt),
    Field(5, "reason", Str, Opt),
    Field(6, "message", Str, Opt),
];
pub(super) const NAMESPACE: &[Field] = &[
    Field(1, "metadata", Msg(OBJECT_META), Opt),
    Field(2, "spec", Msg(&[Field(1, "finalizers", Str, Rep)]), Opt),
    Field(
        3,
        "status",
        Msg(&[
            Field(1, "phase", Str, Opt),
            Field(2, "conditions", Msg(NAMESPACE_CONDITION), Rep),
        ]),
        Opt,
    ),
];
const RESOURCE_CLAIM: &[Field] = &[Field(1, "name", Str, Keep), Field(2, "request", Str, Opt)];
const RESOURCE_REQUIREMENTS: &[Field] = &[
    Field(1, "limits", MapQuantity, Opt),
    Field(2, "requests", MapQuantity, Opt),
    Field(3, "claims", Msg(RESOURCE_CLAIM), Rep),
];
const CONTAINER_PORT: &[Field] = &[
    Field(1, "name", Str, Opt),
    Field(2, "hostPort", Int, Opt),
    Field(3, "containerPort", Int, Keep),
    Field(4, "protocol", Str, Opt),
    Field(5, "hostIP", Str, Opt),
];
const CONTAINER: &[Field] = &[
    Field(1, "name", Str, Keep),
    Field(2, "image", Str, Opt),
    Field(3, "command", Str, Rep),
    Field(4, "args", Str, Rep),
    Field(5, "workingDir", Str, Opt),
    Field(6, "ports", Msg(CONTAINER_PORT), Rep),
    Field(19, "envFrom", Unsupported, Rep),
    Field(7, "env", Unsupported, Rep),
    Field(8, "resources", Msg(RESOURCE_REQUIREMENTS), Opt),
    Field(23, "resizePolicy", Unsupported, Rep),
    Field(24, "restartPolicy", Str, Keep),
    Field(9, "volumeMounts", Unsupported, Rep),
    Field(21, "volumeDevices", Unsupported, Rep),
    Field(10, "livenessProbe", Unsupported, Keep),
    Field(11, "readinessProbe", Unsupported, Keep),
    Field(22, "startupProbe", Unsupported, Keep),
    Field(12, "lifecycle", Unsupported, Keep),
    Field(13, "terminationMessagePath", Str, Opt),
    Field(20, "terminationMessagePolicy", Str, Opt),
    Field(14, "imagePullPolicy", Str, Opt),
    Field(15, "securityContext", Unsupported, Keep),
    Field(16, "stdin", Bool, Opt),
    Field(17, "stdinOnce", Bool, Opt),
    Field(18, "tty", Bool, Opt),
];
const POD_SPEC: &[Field] = &[
    Field(1, "volumes", Unsupported, Rep),
    Field(20, "initContainers", Msg(CONTAINER), Rep),
    // `json:"containers"` without omitempty; kubectl always sends one at least.
    Field(2, "containers", Msg(CONTAINER), Rep),
    Field(34, "ephemeralContainers", Unsupported, Rep),
    Field(3, "restartPolicy", Str, Opt),
    Field(4, "terminationGracePeriodSeconds", Int, Keep),
    Field(5, "activeDeadlineSeconds", Int, Keep),
    Field(6, "dnsPolicy", Str, Opt),
    Field(7, "nodeSelector", MapStr, Opt),
    Field(8, "serviceAccountName", Str, Opt),
    Field(9, "serviceAccount", Str, Opt),
    Field(21, "automountServiceAccountToken", Bool, Keep),
    Field(10, "nodeName", Str, Opt),
    Field(11, "hostNetwork", Bool, Opt),
    Field(12, "hostPID", Bool, Opt),
    Field(13, "hostIPC", Bool, Opt),
    Field(27, "shareProcessNamespace", Bool, Keep),
    Field(14, "securityContext", Unsupported, Keep),
    Field(15, "imagePullSecrets", Msg(LOCAL_OBJECT_REFERENCE), Rep),
    Field(16, "hostname", Str, Opt),
    Field(17, "subdomain", Str, Opt),
    Field(18, "affinity", Unsupported, Keep),
    Field(19, "schedulerName", Str, Opt),
    Field(22, "tolerations", Unsupported, Rep),
    Field(23, "hostAliases", Unsupported, Rep),
    Field(24, "priorityClassName", Str, Opt),
    Field(25, "priority", Int, Keep),
    Field(26, "dnsConfig", Unsupported, Keep),
    Field(28, "readinessGates", Unsupported, Rep),
    Field(29, "runtimeClassName", Str, Keep),
    Field(30, "enableServiceLinks", Bool, Keep),
    Field(31, "preemptionPolicy", Str, Keep),
    Field(32, "overhead", MapQuantity, Opt),
    Field(33, "topologySpreadConstraints", Unsupported, Rep),
    Field(35, "setHostnameAsFQDN", Bool, Keep),
    Field(36, "os", Unsupported, Keep),
    Field(37, "hostUsers", Bool, Keep),
    Field(38, "schedulingGates", Unsupported, Rep),
    Field(39, "resourceClaims", Unsupported, Rep),
    Field(40, "resources", Msg(RESOURCE_REQUIREMENTS), Keep),
];
pub(super) const POD_TEMPLATE_SPEC: &[Field] = &[
    Field(1, "metadata", Msg(OBJECT_META), Opt),
    Field(2, "spec", Msg(POD_SPEC), Opt),
];
