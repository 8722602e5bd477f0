//! CEL as both of the server's rule kinds use it (ValidatingAdmissionPolicy validations and
//! CRD `x-kubernetes-validations`): compiling an expression with the variables its kind
//! declares, reading JSON as CEL values, and evaluating to a truth or a message.
//!
//! CEL is evaluated by the `cel` crate (cel-rust). The functions it evaluates here are
//! [`FUNCTIONS`], Kubernetes' IP and CIDR libraries ([`crate::cel_net`]), the operators and the
//! macros; the other Kubernetes CEL libraries (lists, strings, regex, URLs, quantities, format,
//! semver) are not among them, and each rule kind says what it does with an expression that
//! calls one.

use std::collections::HashMap;
use std::sync::Arc;

use cel::{Context, Program};
use serde_json::Value;

/// The functions and operators of the CEL standard library that `cel` evaluates and rules
/// may call (test `every_supported_function_evaluates`); `has`, `all`, `exists`,
/// `exists_one`, `map` and `filter` are macros and always allowed.
pub(crate) const FUNCTIONS: [&str; 12] = [
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "bytes",
    "type",
];

/// The functions of Kubernetes' strings library (cel-go `ext.Strings`, in the base
/// environment of both rule kinds) that rules may call, evaluated by the `cel` crate's strings
/// extension: `split` (Go's `strings.Split`) and `trim` (leading and trailing white space).
pub(crate) const STRINGS: [&str; 2] = ["split", "trim"];

/// The environment expressions run in: the standard library, the strings extension (only
/// [`STRINGS`] may be called) and [`crate::cel_net`].
pub(crate) fn env() -> Arc<cel::Env> {
    let mut env = cel::Env::stdlib();
    cel::extensions::strings(&mut env).expect("the strings library registers once");
    crate::cel_net::extension(&mut env).expect("the IP and CIDR library registers once");
    Arc::new(env)
}

/// Whether this server evaluates calls of `function`.
fn evaluated(function: &str) -> bool {
    FUNCTIONS.contains(&function)
        || STRINGS.contains(&function)
        || crate::cel_net::FUNCTIONS.contains(&function)
}

/// The longest message a `messageExpression` may produce (`celconfig`'s
/// `MaxEvaluatedMessageExpressionSizeBytes`).
const MAX_MESSAGE_BYTES: usize = 5 * 1024;

/// One compiled expression and its source (quoted in messages).
pub(crate) struct Expr {
    pub source: String,
    pub program: Program,
}

/// Why an expression was not compiled.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CompileError {
    /// The real server refuses it too: `compilation failed: ERROR: <input>:…`.
    Invalid(String),
    /// It calls a function this server does not evaluate (named); the real server may well
    /// evaluate it.
    Unsupported(String),
}

impl CompileError {
    /// The real server's detail (`compilation failed: ERROR: <input>:1:5: …`), naming what
    /// this server cannot evaluate for [`CompileError::Unsupported`].
    pub(crate) fn detail(&self) -> String {
        match self {
            CompileError::Invalid(why) => format!("compilation failed: ERROR: <input>:{why}"),
            CompileError::Unsupported(f) => format!(
                "compilation failed: ERROR: <input>: undeclared reference to '{f}' (in \
                 container ''): this test server's CEL evaluates only {FUNCTIONS:?}, \
                 {STRINGS:?} of the strings library, the IP and CIDR library {:?}, the \
                 operators and the macros",
                crate::cel_net::FUNCTIONS
            ),
        }
    }
}

impl Expr {
    /// Compiles `source`, which may read `variables` (and the variables its comprehension
    /// macros bind) and call what this server evaluates ([`FUNCTIONS`], [`crate::cel_net`]).
    pub(crate) fn compile(source: &str, variables: &[&str]) -> Result<Expr, CompileError> {
        let program = Program::compile(source).map_err(|e| {
            let text = e.to_string();
            CompileError::Invalid(
                text.strip_prefix("ERROR: <input>:")
                    .unwrap_or(&text)
                    .trim()
                    .to_string(),
            )
        })?;
        let refs = program.references();
        for f in refs.functions() {
            let operator = f.starts_with('_') || f.starts_with('@') || f.starts_with('!');
            if !operator && !evaluated(f) {
                return Err(CompileError::Unsupported(f.to_string()));
            }
        }
        let bound = comprehension_variables(source);
        for v in refs.variables() {
            if !variables.contains(&v) && !bound.iter().any(|b| b == v) {
                return Err(CompileError::Invalid(format!(
                    " undeclared reference to '{v}' (in container '')"
                )));
            }
        }
        Ok(Expr {
            source: source.to_string(),
            program,
        })
    }

    /// Whether the expression reads `variable`.
    pub(crate) fn reads(&self, variable: &str) -> bool {
        self.program.references().has_variable(variable)
    }

    /// The expression's boolean value, or the error of an evaluation that failed or gave
    /// something else.
    pub(crate) fn truth(&self, ctx: &Context) -> Result<bool, String> {
        match self.program.execute(ctx) {
            Ok(cel::Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!("{other:?} is not a bool")),
            Err(err) => Err(go_words(&err.to_string())),
        }
    }

    /// A `messageExpression`'s message: its string trimmed, when it evaluates to one that is
    /// not empty, has no line break and is not too long; `None` otherwise (the caller then
    /// falls back to the rule's message, as the real server does).
    pub(crate) fn message(&self, ctx: &Context) -> Option<String> {
        let Ok(cel::Value::String(s)) = self.program.execute(ctx) else {
            return None;
        };
        let s = s.trim();
        (!s.is_empty() && !s.contains('\n') && s.len() <= MAX_MESSAGE_BYTES).then(|| s.into())
    }
}

/// An evaluation error in cel-go's words where cel-rust words it otherwise (`no such key`).
fn go_words(err: &str) -> String {
    match err.strip_prefix("No such key: ") {
        Some(key) => format!("no such key: {key}"),
        None => err.to_string(),
    }
}

/// The names bound by comprehension macros (`list.all(x, …)`), which are variables inside them.
fn comprehension_variables(source: &str) -> Vec<String> {
    let re = regex::Regex::new(
        r"\.(?:all|exists|exists_one|map|filter)\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*,",
    )
    .expect("valid regex");
    re.captures_iter(source).map(|c| c[1].to_string()).collect()
}

/// JSON as CEL reads a Kubernetes object: integers are `int` (serde's conversion would make
/// the non-negative ones `uint`, and CEL has no arithmetic mixing the two).
pub(crate) fn to_cel(v: &Value) -> cel::Value {
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(a) => cel::Value::List(Arc::new(a.iter().map(to_cel).collect())),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| (k.clone(), to_cel(v)))
            .collect::<HashMap<String, cel::Value>>()
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eval(src: &str) -> cel::Value {
        let e = Expr::compile(src, &["object"]).expect("compiles");
        let mut ctx = Context::with_env(env());
        let object = json!({"s": "abc", "l": [1, 2], "m": {"k": "v"}});
        ctx.add_variable_from_value("object", to_cel(&object));
        e.program.execute(&ctx).expect("evaluates")
    }

    #[test]
    fn every_supported_function_evaluates() {
        for (src, want) in [
            ("size(object.s) == 3", true),
            ("object.s.size() == 3 && size(object.l) == 2", true),
            ("object.s.contains('b')", true),
            ("object.s.startsWith('ab')", true),
            ("object.s.endsWith('bc')", true),
            ("object.s.matches('^a.c$')", true),
            ("int('7') == 7 && uint(7) == 7u && double(1) == 1.0", true),
            ("string(7) == '7' && bool('true')", true),
            ("bytes('a') == b'a' && type(1) == type(2)", true),
            (
                "has(object.m.k) && !has(object.m.z) && 'k' in object.m",
                true,
            ),
            ("object.l.all(x, x > 0) && object.l.exists(x, x == 2)", true),
            (
                "object.l.exists_one(x, x == 1) && object.l.map(x, x * 2) == [2, 4]",
                true,
            ),
            ("object.l.filter(x, x > 1) == [2]", true),
            ("object.m == {'k': 'v'} && object == object", true),
            (
                "' a , b,'.split(',').map(x, x.trim()) == ['a', 'b', ''] && object.s.split('') == ['a', 'b', 'c']",
                true,
            ),
        ] {
            assert_eq!(eval(src), cel::Value::Bool(want), "{src}");
        }
        // every name in FUNCTIONS is exercised above
        let sources =
            "size contains startsWith endsWith matches int uint double string bool bytes type";
        assert_eq!(sources.split(' ').collect::<Vec<_>>(), FUNCTIONS);
        assert_eq!(["split", "trim"], STRINGS, "both exercised above");
    }

    #[test]
    fn what_cannot_be_evaluated_is_named() {
        let e = Expr::compile("object.s.lowerAscii() == 'abc'", &["object"]);
        assert_eq!(
            e.err(),
            Some(CompileError::Unsupported("lowerAscii".into()))
        );
        let e = Expr::compile("params.x == 1", &["object"])
            .err()
            .expect("refused");
        assert!(
            e.detail()
                .ends_with("undeclared reference to 'params' (in container '')"),
            "{e:?}"
        );
        let e = Expr::compile("object.foo(", &["object"])
            .err()
            .expect("refused");
        assert!(
            e.detail()
                .starts_with("compilation failed: ERROR: <input>:1:12: Syntax error"),
            "{e:?}"
        );
        assert!(
            Expr::compile("object.l.all(item, item > 0)", &["object"]).is_ok(),
            "a comprehension's variable"
        );
        let e = Expr::compile("self == oldSelf", &["self", "oldSelf"]).expect("compiles");
        assert!(e.reads("oldSelf"));
        assert!(
            !Expr::compile("self > 1", &["self", "oldSelf"])
                .unwrap()
                .reads("oldSelf")
        );
    }
}
