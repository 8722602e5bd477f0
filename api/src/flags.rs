//! The parsers of the operator's and the agent's flags that need more than `FromStr`, one
//! way for both command lines: listen addresses take Go's `:PORT`; and for the duration and
//! count flags, every interval has a floor and every duration and count a ceiling, and a
//! value outside them is refused naming the range (an unbounded value pinned a core at
//! `1ns`, aborted on a huge allocation or overflowed the clock). Each parser returns clap's
//! `value_parser` shape; clap adds the flag and the value to its message.

use std::fmt::Display;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

/// The longest duration any flag takes (30 days).
pub const MAX_DURATION: Duration = Duration::from_secs(30 * 24 * 3600);

/// A duration (`30s`, `2m`, `1h`) within `floor..=ceiling`.
pub fn duration_within(s: &str, floor: Duration, ceiling: Duration) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{e} (write durations like 30s, 2m, 1h)"))?;
    let range = || {
        format!(
            "the range is {} to {}",
            humantime::format_duration(floor),
            humantime::format_duration(ceiling)
        )
    };
    if d < floor {
        return Err(format!(
            "at least {} ({})",
            humantime::format_duration(floor),
            range()
        ));
    }
    if d > ceiling {
        return Err(format!(
            "at most {} ({})",
            humantime::format_duration(ceiling),
            range()
        ));
    }
    Ok(d)
}

/// A whole number within `lo..=hi`.
pub fn count_within<T>(s: &str, lo: T, hi: T) -> Result<T, String>
where
    T: FromStr + PartialOrd + Display,
    T::Err: Display,
{
    match s.parse::<T>() {
        Ok(v) if lo <= v && v <= hi => Ok(v),
        Ok(_) => Err(format!("out of range (the range is {lo} to {hi})")),
        // an integer too large for T is out of range too
        Err(e) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            Err(format!("{e}: out of range (the range is {lo} to {hi})"))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// A listen address: `HOST:PORT`, `[V6]:PORT`, or `:PORT` for every interface, as Go
/// programs (the kubelet, Cilium, Prometheus) take it.
pub fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    let full = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.to_string(),
    };
    full.parse()
        .map_err(|e| format!("{e} (write HOST:PORT, [IPv6]:PORT or :PORT)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_take_go_s_port_only_form() {
        assert_eq!(listen_addr(":9690"), Ok("0.0.0.0:9690".parse().unwrap()));
        assert_eq!(
            listen_addr("127.0.0.1:1"),
            Ok("127.0.0.1:1".parse().unwrap())
        );
        assert_eq!(listen_addr("[::1]:5"), Ok("[::1]:5".parse().unwrap()));
        for bad in ["9690", ":", ":x", "host:1"] {
            let e = listen_addr(bad).unwrap_err();
            assert!(e.contains(":PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn durations_outside_their_range_name_it() {
        let (s, h) = (Duration::from_secs(1), Duration::from_secs(3600));
        assert_eq!(duration_within("1s", s, h), Ok(s));
        assert_eq!(duration_within("1h", s, h), Ok(h));
        let e = duration_within("1ns", s, h).unwrap_err();
        assert!(e.contains("at least 1s") && e.contains("1s to 1h"), "{e}");
        let e = duration_within("300000000000y", s, h).unwrap_err();
        assert!(e.contains("at most 1h") && e.contains("1s to 1h"), "{e}");
        let e = duration_within("ten", s, h).unwrap_err();
        assert!(e.contains("like 30s"), "{e}");
    }

    #[test]
    fn counts_outside_their_range_name_it() {
        assert_eq!(count_within("1", 1usize, 10), Ok(1));
        assert_eq!(count_within("10", 1usize, 10), Ok(10));
        for bad in ["0", "11", "18446744073709551616"] {
            let e = count_within(bad, 1usize, 10).unwrap_err();
            assert!(e.contains("1 to 10"), "{bad}: {e}");
        }
        assert!(count_within("-1", 1usize, 10).is_err());
    }
}
