//! k8s.io/api authorization/v1: the self access reviews `kubectl auth can-i` sends (their
//! status is the server's to fill).

use super::fields::Card::{Keep, Opt};
use super::fields::Ty::{Msg, Str, Unsupported};
use super::fields::{Field, OBJECT_META};

const RESOURCE_ATTRIBUTES: &[Field] = &[
    Field(1, "namespace", Str, Opt),
    Field(2, "verb", Str, Opt),
    Field(3, "group", Str, Opt),
    Field(4, "version", Str, Opt),
    Field(5, "resource", Str, Opt),
    Field(6, "subresource", Str, Opt),
    Field(7, "name", Str, Opt),
    Field(8, "fieldSelector", Unsupported, Keep),
    Field(9, "labelSelector", Unsupported, Keep),
];
const NON_RESOURCE_ATTRIBUTES: &[Field] = &[Field(1, "path", Str, Opt), Field(2, "verb", Str, Opt)];
pub(super) const SELF_SUBJECT_ACCESS_REVIEW: &[Field] = &[
    Field(1, "metadata", Msg(OBJECT_META), Opt),
    Field(
        2,
        "spec",
        Msg(&[
            Field(1, "resourceAttributes", Msg(RESOURCE_ATTRIBUTES), Opt),
            Field(
                2,
                "nonResourceAttributes",
                Msg(NON_RESOURCE_ATTRIBUTES),
                Opt,
            ),
        ]),
        Opt,
    ),
];
pub(super) const SELF_SUBJECT_RULES_REVIEW: &[Field] = &[
    Field(1, "metadata", Msg(OBJECT_META), Opt),
    Field(2, "spec", Msg(&[Field(1, "namespace", Str, Opt)]), Opt),
];
