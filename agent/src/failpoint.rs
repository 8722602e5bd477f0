//! Named failpoints for the crash tests (agent/tests/crash.rs): places in the agent where a
//! test stops it, kills it with SIGKILL and restarts it, to show that no address is lost or
//! given twice whichever step a crash interrupts (issue 15).
//!
//! `TIDEPOOL_FAILPOINTS=add-after-persist,before-publish@2` arms points by name, read once
//! when the binary starts ([`init_from_env`]). When an armed point is reached the agent prints
//! `failpoint <name> reached` on stderr and the request (or task) that reached it blocks
//! forever; the test waits for that line, then kills the process. `name@N` arms the point
//! from its N-th hit on (the start-up publish is the first `before-publish`); `name@/path`
//! from the first hit at which the file `/path` exists, for a point such as `before-publish`
//! whose earlier hits a test cannot count (how many status writes a start-up makes depends
//! on the order its watches' lists arrive in). Unset, a point costs one atomic load.
//!
//! The points ([`Failpoint`]): `add-` / `del-` / `ack-before-persist` (the change made in
//! memory, the checkpoint not yet saved), `add-` / `del-` / `ack-after-persist` (the
//! checkpoint durable, the reply or the publish not yet made), `before-publish` (the
//! publisher about to send a server-side apply). `ack` is the answer to the operator's
//! tombstones and release marks.
//!
//! Hand-rolled rather than the `fail` crate: its points compile to nothing unless a cargo
//! feature is on, so the binary the crash tests kill would differ from the one shipped, or
//! every build of the workspace would have to juggle that feature. These points stay in the
//! shipped binary, inert unless the variable names them.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// The environment variable that arms failpoints (comma-separated names, each optionally
/// `@N`).
pub const ENV: &str = "TIDEPOOL_FAILPOINTS";

/// A place in the agent where a crash test may stop it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failpoint {
    AddBeforePersist,
    AddAfterPersist,
    DelBeforePersist,
    DelAfterPersist,
    AckBeforePersist,
    AckAfterPersist,
    BeforePublish,
}

impl Failpoint {
    pub const ALL: [Failpoint; 7] = [
        Failpoint::AddBeforePersist,
        Failpoint::AddAfterPersist,
        Failpoint::DelBeforePersist,
        Failpoint::DelAfterPersist,
        Failpoint::AckBeforePersist,
        Failpoint::AckAfterPersist,
        Failpoint::BeforePublish,
    ];

    /// The name `TIDEPOOL_FAILPOINTS` uses.
    pub fn name(self) -> &'static str {
        match self {
            Failpoint::AddBeforePersist => "add-before-persist",
            Failpoint::AddAfterPersist => "add-after-persist",
            Failpoint::DelBeforePersist => "del-before-persist",
            Failpoint::DelAfterPersist => "del-after-persist",
            Failpoint::AckBeforePersist => "ack-before-persist",
            Failpoint::AckAfterPersist => "ack-after-persist",
            Failpoint::BeforePublish => "before-publish",
        }
    }

    /// The line printed on stderr when the point stops the agent.
    pub fn reached_line(self) -> String {
        format!("failpoint {} reached", self.name())
    }
}

/// One armed point: it stops the agent from its `from`-th hit on, or once `from_file`
/// exists.
#[derive(Debug)]
pub struct Armed {
    point: Failpoint,
    from: u64,
    from_file: Option<PathBuf>,
    hits: AtomicU64,
}

impl Armed {
    /// Counts a hit; whether this one stops.
    fn hit(&self) -> bool {
        let n = self.hits.fetch_add(1, Ordering::SeqCst) + 1;
        match &self.from_file {
            Some(file) => file.exists(),
            None => n >= self.from,
        }
    }
}

static ARMED: OnceLock<Vec<Armed>> = OnceLock::new();

/// Parses `TIDEPOOL_FAILPOINTS`' value: names, each optionally `@N` (N ≥ 1).
pub fn parse(spec: &str) -> Result<Vec<Armed>> {
    let bad = |why: String| Error::Config(format!("{ENV}: {why}"));
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|item| {
            let (name, from, from_file) = match item.split_once('@') {
                Some((n, f)) if f.starts_with('/') => (n, 1, Some(PathBuf::from(f))),
                Some((n, k)) => {
                    let k: u64 = k
                        .parse()
                        .ok()
                        .filter(|k| *k >= 1)
                        .ok_or_else(|| bad(format!("{item}: @N needs N >= 1")))?;
                    (n, k, None)
                }
                None => (item, 1, None),
            };
            let point = Failpoint::ALL
                .into_iter()
                .find(|p| p.name() == name)
                .ok_or_else(|| bad(format!("unknown failpoint {name:?}")))?;
            Ok(Armed {
                point,
                from,
                from_file,
                hits: AtomicU64::new(0),
            })
        })
        .collect()
}

/// Arms the points `TIDEPOOL_FAILPOINTS` names (nothing when unset). Call once, at start;
/// a later call changes nothing. A name it does not know is an error (a typo would
/// otherwise make a crash test pass without crashing).
pub fn init_from_env() -> Result<()> {
    let Some(spec) = std::env::var_os(ENV) else {
        return Ok(());
    };
    let spec = spec
        .into_string()
        .map_err(|_| Error::Config(format!("{ENV} is not UTF-8")))?;
    let armed = parse(&spec)?;
    if !armed.is_empty() {
        let names: Vec<&str> = armed.iter().map(|a| a.point.name()).collect();
        tracing::warn!(failpoints = ?names, "failpoints armed: this agent stops where they are reached (tests only)");
        let _ = ARMED.set(armed);
    }
    Ok(())
}

/// Whether `point` stops here (counting the hit).
fn stops(point: Failpoint) -> bool {
    let Some(armed) = ARMED.get() else {
        return false;
    };
    let stop = armed.iter().filter(|a| a.point == point).any(Armed::hit);
    if stop {
        eprintln!("{}", point.reached_line());
    }
    stop
}

/// In blocking code (a save on the blocking pool): if `point` is armed and due, prints its
/// line and blocks this thread forever.
pub fn reach(point: Failpoint) {
    if stops(point) {
        loop {
            std::thread::park();
        }
    }
}

/// In async code: if `point` is armed and due, prints its line and never completes.
pub async fn reach_async(point: Failpoint) {
    if stops(point) {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_counts_are_parsed_and_typos_refused() {
        let armed = parse(" add-before-persist, before-publish@2 ,").expect("parse");
        let got: Vec<(Failpoint, u64)> = armed.iter().map(|a| (a.point, a.from)).collect();
        assert_eq!(
            got,
            [
                (Failpoint::AddBeforePersist, 1),
                (Failpoint::BeforePublish, 2)
            ]
        );
        for bad in [
            "add-before-persit",
            "before-publish@0",
            "before-publish@x",
            "x@/tmp/a",
        ] {
            assert!(parse(bad).is_err(), "{bad} accepted");
        }
        for p in Failpoint::ALL {
            assert_eq!(parse(p.name()).expect("every name parses")[0].point, p);
        }
    }

    #[test]
    fn a_point_stops_from_its_nth_hit_on() {
        let a = &parse("before-publish@3").expect("parse")[0];
        assert_eq!(
            [a.hit(), a.hit(), a.hit(), a.hit()],
            [false, false, true, true]
        );
    }

    #[test]
    fn a_point_armed_by_a_file_stops_once_it_exists() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("arm");
        let a = &parse(&format!("before-publish@{}", file.display())).expect("parse")[0];
        assert_eq!([a.hit(), a.hit()], [false, false], "not yet armed");
        std::fs::write(&file, "").expect("arm");
        assert_eq!([a.hit(), a.hit()], [true, true]);
    }
}
