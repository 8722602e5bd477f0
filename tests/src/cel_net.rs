//! Kubernetes' CEL IP and CIDR libraries, as kube-apiserver evaluates them since 1.30
//! (`k8s.io/apiserver/pkg/cel/library/ip.go` and `cidr.go`, registered by
//! `pkg/cel/environment/base.go` at `IntroducedVersion: 1.30`; the `net.IP` and `net.CIDR`
//! types are `pkg/cel/ip.go` and `cidr.go`):
//!
//! - `isIP(string)`, `ip(string)`, `string(ip)`, `ip.family()` (4 or 6);
//! - `isCIDR(string)`, `cidr(string)`, `string(cidr)`, `cidr.ip()`, `cidr.prefixLength()`,
//!   `cidr.masked()`, `cidr.containsIP(ip or string)`, `cidr.containsCIDR(cidr or string)`;
//! - `==` on two IPs or two CIDRs compares address and prefix length (`netip.Prefix ==`):
//!   `cidr('10.2.0.1/16') == cidr('10.2.0.1/16').masked()` is false.
//!
//! Parsing is Go's `netip.ParseAddr` / `ParsePrefix` with Kubernetes' additions: no zone, no
//! IPv4 octet with a leading zero, no prefix length with one, and no IPv4-mapped IPv6 address
//! (`::ffff:1.2.3.4`). `cidr()` keeps host bits (`cidr('10.2.0.1/16')` is valid; `masked()`
//! clears them). The IP library's classification functions (`isLoopback`, `isGlobalUnicast`,
//! …) and `ip.isCanonical` are not here: an expression calling one is not evaluated
//! ([`crate::cel_expr`]).

use std::any::Any;
use std::net::IpAddr;

use cel::common::types::{CelBool, CelInt, CelString, Kind, Type};
use cel::common::value::{StaticVal, Val};
use cel::{Env, ExecutionError};

/// The functions this library adds, for [`crate::cel_expr`]'s list of what is evaluated.
pub(crate) const FUNCTIONS: [&str; 10] = [
    "isIP",
    "ip",
    "family",
    "isCIDR",
    "cidr",
    "prefixLength",
    "masked",
    "containsIP",
    "containsCIDR",
    "string",
];

static IP_TYPE: Type = Type::simple_type(Kind::Opaque, "net.IP");
static CIDR_TYPE: Type = Type::simple_type(Kind::Opaque, "net.CIDR");

/// A `net.IP` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ip(IpAddr);

/// A `net.CIDR` value: an address (host bits kept) and a prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cidr {
    addr: IpAddr,
    bits: u8,
}

macro_rules! opaque_val {
    ($t:ty, $ty:expr) => {
        impl Val for $t {
            fn get_type(&self) -> &Type {
                &$ty
            }
            fn cel_type() -> &'static Type {
                &$ty
            }
            fn equals(&self, other: &dyn Val) -> bool {
                other.downcast_ref::<$t>() == Some(self)
            }
            fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v> {
                Box::new(*self)
            }
            fn as_any(&self) -> Option<&dyn Any> {
                Some(self)
            }
        }
        impl StaticVal for $t {}
    };
}

opaque_val!(Ip, IP_TYPE);
opaque_val!(Cidr, CIDR_TYPE);

/// Registers the library's overloads on `env`.
pub(crate) fn extension(env: &mut Env) -> Result<(), cel::DeclarationError> {
    cel::add_overload!(env, fn is_ip: (CelString) -> CelBool, name = "isIP")?;
    cel::add_overload!(env, fn to_ip: (CelString) -> Result<Ip>, name = "ip")?;
    cel::add_overload!(env, fn ip_string: (Ip) -> CelString, name = "string")?;
    cel::add_member_overload!(env, fn family: (Ip) -> CelInt)?;
    cel::add_overload!(env, fn is_cidr: (CelString) -> CelBool, name = "isCIDR")?;
    cel::add_overload!(env, fn to_cidr: (CelString) -> Result<Cidr>, name = "cidr")?;
    cel::add_overload!(env, fn cidr_string: (Cidr) -> CelString, name = "string")?;
    cel::add_member_overload!(env, fn cidr_ip: (Cidr) -> Ip, name = "ip")?;
    cel::add_member_overload!(env, fn prefix_length: (Cidr) -> CelInt)?;
    cel::add_member_overload!(env, fn masked: (Cidr) -> Cidr)?;
    cel::add_member_overload!(env, fn contains_ip: (Cidr, Ip) -> CelBool, name = "containsIP")?;
    cel::add_member_overload!(env, fn contains_ip_string: (Cidr, CelString) -> Result<CelBool>,
        name = "containsIP")?;
    cel::add_member_overload!(env, fn contains_cidr: (Cidr, Cidr) -> CelBool,
        name = "containsCIDR")?;
    cel::add_member_overload!(env, fn contains_cidr_string: (Cidr, CelString) -> Result<CelBool>,
        name = "containsCIDR")?;
    Ok(())
}

/// `netip.ParseAddr`, then Kubernetes' refusal of IPv4-mapped IPv6 addresses. Rust's parser
/// refuses zones and IPv4 octets with a leading zero, as Go's does.
fn parse_ip(s: &str) -> Result<IpAddr, String> {
    let addr: IpAddr = s
        .parse()
        .map_err(|_| format!("IP Address {s:?} parse error during conversion from string"))?;
    match addr {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => {
            Err(format!("IPv4-mapped IPv6 address {s:?} is not allowed"))
        }
        _ => Ok(addr),
    }
}

/// `netip.ParsePrefix` (a decimal prefix length with no sign and no leading zero, at most
/// the family's bits; host bits kept), then the IPv4-mapped refusal.
fn parse_cidr(s: &str) -> Result<Cidr, String> {
    let bad = || format!("network address parse error during conversion from string: {s:?}");
    let (addr, bits) = s.split_once('/').ok_or_else(bad)?;
    let addr = parse_ip(addr).map_err(|_| bad())?;
    let digits_ok = !bits.is_empty()
        && bits.bytes().all(|b| b.is_ascii_digit())
        && (bits == "0" || !bits.starts_with('0'));
    let bits: u8 = bits.parse().ok().filter(|_| digits_ok).ok_or_else(bad)?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if bits > max {
        return Err(bad());
    }
    Ok(Cidr { addr, bits })
}

fn is_ip(s: &CelString<'_>) -> CelBool {
    CelBool::from(parse_ip(s.inner()).is_ok())
}

fn to_ip(s: &CelString<'_>) -> Result<Ip, ExecutionError> {
    parse_ip(s.inner())
        .map(Ip)
        .map_err(|e| ExecutionError::function_error("ip", e))
}

fn ip_string(ip: &Ip) -> CelString<'static> {
    ip.0.to_string().into()
}

fn family(ip: &Ip) -> CelInt {
    CelInt::from(if ip.0.is_ipv4() { 4 } else { 6 })
}

fn is_cidr(s: &CelString<'_>) -> CelBool {
    CelBool::from(parse_cidr(s.inner()).is_ok())
}

fn to_cidr(s: &CelString<'_>) -> Result<Cidr, ExecutionError> {
    parse_cidr(s.inner()).map_err(|e| ExecutionError::function_error("cidr", e))
}

fn cidr_string(c: &Cidr) -> CelString<'static> {
    format!("{}/{}", c.addr, c.bits).into()
}

fn cidr_ip(c: &Cidr) -> Ip {
    Ip(c.addr)
}

fn prefix_length(c: &Cidr) -> CelInt {
    CelInt::from(i64::from(c.bits))
}

fn masked(c: &Cidr) -> Cidr {
    let net = ipnet::IpNet::new(c.addr, c.bits).expect("a parsed prefix length fits");
    Cidr {
        addr: net.network(),
        bits: c.bits,
    }
}

fn contains_ip(c: &Cidr, ip: &Ip) -> CelBool {
    let net = ipnet::IpNet::new(c.addr, c.bits).expect("a parsed prefix length fits");
    CelBool::from(net.contains(&ip.0))
}

fn contains_ip_string(c: &Cidr, s: &CelString<'_>) -> Result<CelBool, ExecutionError> {
    Ok(contains_ip(c, &to_ip(s)?))
}

/// `cidr.Prefix.Masked() == netip.PrefixFrom(other.Addr(), cidr.Bits())` and
/// `cidr.Bits() <= other.Bits()`: the other's address lies in this prefix, and it is no
/// shorter. (Go's `Masked()` of a prefix holds the family, so a v4 and a v6 never match.)
fn contains_cidr(c: &Cidr, other: &Cidr) -> CelBool {
    let same_family = c.addr.is_ipv4() == other.addr.is_ipv4();
    let inside = same_family && contains_ip(c, &Ip(other.addr)) == CelBool::from(true);
    CelBool::from(inside && c.bits <= other.bits)
}

fn contains_cidr_string(c: &Cidr, s: &CelString<'_>) -> Result<CelBool, ExecutionError> {
    Ok(contains_cidr(c, &to_cidr(s)?))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cel::{Context, Program, Value};

    fn eval(src: &str) -> Result<Value, cel::ExecutionError> {
        let mut env = Env::stdlib();
        extension(&mut env).expect("the library registers");
        let ctx = Context::with_env(Arc::new(env));
        Program::compile(src).expect("compiles").execute(&ctx)
    }

    use super::*;

    /// The examples of `cidr.go`'s and `ip.go`'s documentation, with the results their
    /// code gives (`cidr('192.168.0.1/16')` is valid: the code keeps host bits).
    #[test]
    fn kubernetes_examples_evaluate_as_the_real_library_does() {
        for (src, want) in [
            ("isCIDR('192.168.0.0/16')", true),
            ("isCIDR('::1/128')", true),
            ("isCIDR('192.168.0.0/33')", false),
            ("isCIDR('::1/129')", false),
            ("isCIDR('192.168.0.1/16')", true),
            ("isCIDR('::ffff:1.2.3.4/120')", false),
            (
                "isCIDR('10.0.0.0/08') || isCIDR('010.0.0.0/8') || isCIDR('10.0.0.0')",
                false,
            ),
            ("isCIDR('fe80::1%eth0/64')", false),
            ("cidr('192.168.0.0/24').containsIP(ip('192.168.0.1'))", true),
            (
                "cidr('192.168.0.0/24').containsIP(ip('192.168.1.1'))",
                false,
            ),
            ("cidr('192.168.0.0/24').containsIP('192.168.0.1')", true),
            (
                "cidr('192.168.0.0/16').containsCIDR(cidr('192.168.10.0/24'))",
                true,
            ),
            (
                "cidr('192.168.1.0/24').containsCIDR(cidr('192.168.2.0/24'))",
                false,
            ),
            (
                "cidr('192.168.0.0/16').containsCIDR('192.168.10.0/24')",
                true,
            ),
            (
                "cidr('192.168.0.0/24').containsCIDR('192.168.0.0/16')",
                false,
            ),
            ("cidr('192.168.0.1/24').ip() == ip('192.168.0.1')", true),
            ("cidr('192.168.0.1/24').ip().family() == 4", true),
            ("cidr('::1/128').ip().family() == 6", true),
            (
                "cidr('192.168.0.1/24').masked() == cidr('192.168.0.0/24')",
                true,
            ),
            (
                "cidr('192.168.0.0/24') == cidr('192.168.0.0/24').masked()",
                true,
            ),
            (
                "cidr('192.168.0.1/24') == cidr('192.168.0.1/24').masked()",
                false,
            ),
            ("cidr('192.168.0.0/24') == cidr('192.168.0.0/25')", false),
            ("cidr('192.168.0.0/16').prefixLength() == 16", true),
            ("cidr('::1/128').prefixLength() == 128", true),
            ("string(cidr('fd00:0::1/64').masked()) == 'fd00::/64'", true),
            ("string(ip('127.0.0.1')) == '127.0.0.1'", true),
            (
                "isIP('1.2.3.4') && !isIP('1.2.3.04') && !isIP('::ffff:1.2.3.4')",
                true,
            ),
        ] {
            assert_eq!(eval(src), Ok(Value::Bool(want)), "{src}");
        }
        assert!(eval("cidr('10.0.0.0/33') == cidr('10.0.0.0/8')").is_err());
        assert!(eval("ip('300.0.0.1') == ip('1.2.3.4')").is_err());
    }
}
