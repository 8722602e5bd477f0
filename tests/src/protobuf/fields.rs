//! How a message's fields are described (number, JSON name, type, and when JSON writes
//! them), and the k8s.io/apimachinery messages every kind embeds. Field numbers are those
//! of the `generated.proto` files of k8s.io/apimachinery and k8s.io/api v0.32 (kubectl 1.32).

/// How one field's value is written in JSON.
#[derive(Clone, Copy)]
pub(super) enum Ty {
    Str,
    Bool,
    /// Any varint integer (`int32`, `int64`; negative ones are sign-extended to 64 bits).
    Int,
    /// A nested message: written whenever it is on the wire, whatever its `Card` (Go's JSON
    /// never omits a struct, and a nil pointer is not on the wire).
    Msg(&'static [Field]),
    /// `map<string, string>`.
    MapStr,
    /// `map<string, bytes>`.
    MapBytes,
    /// `map<string, resource.Quantity>` (a `ResourceList`): quantities as their strings.
    MapQuantity,
    /// `meta.v1.Time` (seconds, nanos): RFC 3339, or nothing for the zero time.
    Time,
    /// `meta.v1.FieldsV1`: its raw JSON.
    FieldsV1,
    /// `intstr.IntOrString`: a JSON number or string.
    IntOrString,
    /// A field of the real type this server does not decode: its presence is refused with
    /// 415 rather than dropped, so a protobuf body never loses what a JSON body would keep.
    Unsupported,
}

/// When JSON writes a field, from its Go type and `json` tag.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Card {
    /// A value with `omitempty`: its zero value ("", 0, false) is left out.
    Opt,
    /// A pointer, or a value without `omitempty`: written whenever it is on the wire, zero
    /// included (Go's protobuf encoding leaves out nil pointers only).
    Keep,
    /// `repeated`: a JSON array, each element written as it is.
    Rep,
}

/// One field of a message: number, JSON name, type, cardinality.
pub(super) struct Field(
    pub(super) u32,
    pub(super) &'static str,
    pub(super) Ty,
    pub(super) Card,
);

use Card::{Keep, Opt, Rep};
use Ty::{Bool, FieldsV1, Int, MapStr, Msg, Str, Time};

pub(super) const TYPE_META: &[Field] =
    &[Field(1, "apiVersion", Str, Opt), Field(2, "kind", Str, Opt)];
const OWNER_REFERENCE: &[Field] = &[
    Field(5, "apiVersion", Str, Keep),
    Field(1, "kind", Str, Keep),
    Field(3, "name", Str, Keep),
    Field(4, "uid", Str, Keep),
    Field(6, "controller", Bool, Keep),
    Field(7, "blockOwnerDeletion", Bool, Keep),
];
const MANAGED_FIELDS_ENTRY: &[Field] = &[
    Field(1, "manager", Str, Opt),
    Field(2, "operation", Str, Opt),
    Field(3, "apiVersion", Str, Opt),
    Field(4, "time", Time, Opt),
    Field(6, "fieldsType", Str, Opt),
    Field(7, "fieldsV1", FieldsV1, Opt),
    Field(8, "subresource", Str, Opt),
];
pub(super) const OBJECT_META: &[Field] = &[
    Field(1, "name", Str, Opt),
    Field(2, "generateName", Str, Opt),
    Field(3, "namespace", Str, Opt),
    Field(4, "selfLink", Str, Opt),
    Field(5, "uid", Str, Opt),
    Field(6, "resourceVersion", Str, Opt),
    Field(7, "generation", Int, Opt),
    Field(8, "creationTimestamp", Time, Opt),
    Field(9, "deletionTimestamp", Time, Opt),
    Field(10, "deletionGracePeriodSeconds", Int, Keep),
    Field(11, "labels", MapStr, Opt),
    Field(12, "annotations", MapStr, Opt),
    Field(13, "ownerReferences", Msg(OWNER_REFERENCE), Rep),
    Field(14, "finalizers", Str, Rep),
    Field(17, "managedFields", Msg(MANAGED_FIELDS_ENTRY), Rep),
];
const LABEL_SELECTOR_REQUIREMENT: &[Field] = &[
    Field(1, "key", Str, Keep),
    Field(2, "operator", Str, Keep),
    Field(3, "values", Str, Rep),
];
pub(super) const LABEL_SELECTOR: &[Field] = &[
    Field(1, "matchLabels", MapStr, Opt),
    Field(2, "matchExpressions", Msg(LABEL_SELECTOR_REQUIREMENT), Rep),
];
