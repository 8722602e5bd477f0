//! The probe (I/O): what the runtime's netns directory and CNI result cache hold now.
//! Reads names, and a few cache entries to confirm the layout; writes nothing.
//!
//! libcni (containerd through go-cni, CRI-O through ocicni) caches the result of every ADD
//! that succeeded in `<cacheDir>/results/<networkName>-<containerID>-<ifname>`, a JSON
//! object with `kind` `cniCacheV1`, `containerId`, `ifName`, `networkName`, `config` and
//! `result`, and removes it on DEL (research/node-agent.md). The layout counts as known only
//! when an entry reads that way and its name is made of its own fields: an empty or foreign
//! directory (a wrong mount, another runtime) would make every allocation look dead.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;

use serde::Deserialize;

use super::decide::{Cache, Netns};

/// How many cache entries are read at most to confirm the layout.
const LAYOUT_PROBES: usize = 8;
/// The most read of one cache entry (they hold a network config and a result: kilobytes).
const MAX_ENTRY_BYTES: u64 = 1 << 20;

/// The netns directory's entries.
pub fn netns(dir: &Path) -> Netns {
    match names(dir) {
        Err(why) => Netns::Invisible(why),
        Ok(n) if n.is_empty() => Netns::Empty,
        Ok(n) => Netns::Populated(n),
    }
}

/// The cache directory's entries, once an entry confirmed the layout.
pub fn cache(dir: &Path) -> Cache {
    let entries = match names(dir) {
        Err(why) => return Cache::Invisible(why),
        Ok(n) => n,
    };
    if entries.is_empty() {
        return Cache::UnknownLayout(format!("{} has no entry", dir.display()));
    }
    let confirmed = entries
        .iter()
        .take(LAYOUT_PROBES)
        .any(|n| read_entry(&dir.join(n)).is_some_and(|bytes| confirms(n, &bytes)));
    if !confirmed {
        let why = format!(
            "none of the first {} entries of {} reads as libcni's <networkName>-<containerID>-<ifname>",
            entries.len().min(LAYOUT_PROBES),
            dir.display()
        );
        return Cache::UnknownLayout(why);
    }
    Cache::Known(entries)
}

/// The names in `dir` (those that are UTF-8: the runtimes' all are), or why not.
fn names(dir: &Path) -> Result<BTreeSet<String>, String> {
    let list = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut out = BTreeSet::new();
    for entry in list {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        if let Ok(n) = entry.file_name().into_string() {
            out.insert(n);
        }
    }
    Ok(out)
}

fn read_entry(path: &Path) -> Option<Vec<u8>> {
    let f = std::fs::File::open(path).ok()?;
    let mut bytes = Vec::new();
    f.take(MAX_ENTRY_BYTES).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The fields of libcni's cache entry that name it.
#[derive(Deserialize)]
struct Entry {
    #[serde(rename = "containerId")]
    container_id: String,
    #[serde(rename = "ifName")]
    ifname: String,
    #[serde(rename = "networkName")]
    network: String,
}

/// Whether the entry `name` with contents `bytes` is libcni's: its name is
/// `<networkName>-<containerId>-<ifName>` of its own fields.
pub fn confirms(name: &str, bytes: &[u8]) -> bool {
    let Ok(e) = serde_json::from_slice::<Entry>(bytes) else {
        return false;
    };
    let empty = e.container_id.is_empty() || e.ifname.is_empty() || e.network.is_empty();
    !empty && name == format!("{}-{}-{}", e.network, e.container_id, e.ifname)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry as libcni writes it (trimmed config and result).
    fn libcni_entry(net: &str, c: &str, ifname: &str) -> String {
        serde_json::json!({
            "kind": "cniCacheV1", "containerId": c, "ifName": ifname, "networkName": net,
            "config": "eyJjbmlWZXJzaW9uIjoiMS4wLjAifQ==",
            "result": {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.5/16"}]},
        })
        .to_string()
    }

    #[test]
    fn a_missing_or_empty_netns_dir_is_told_apart_from_a_populated_one() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("netns");
        assert!(matches!(netns(&dir), Netns::Invisible(_)));
        std::fs::create_dir(&dir).expect("mkdir");
        assert_eq!(netns(&dir), Netns::Empty);
        std::fs::write(dir.join("cni-1"), "").expect("write");
        let want: BTreeSet<String> = ["cni-1".to_string()].into();
        assert_eq!(netns(&dir), Netns::Populated(want));
    }

    #[test]
    fn the_cache_counts_only_once_an_entry_confirms_the_layout() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("results");
        assert!(matches!(cache(&dir), Cache::Invisible(_)));
        std::fs::create_dir(&dir).expect("mkdir");
        assert!(matches!(cache(&dir), Cache::UnknownLayout(_)), "empty");
        // a name that is not made of the entry's own fields, and one that is no JSON
        std::fs::write(dir.join("pods-c9-eth0"), libcni_entry("pods", "c1", "eth0")).expect("w");
        std::fs::write(dir.join("junk"), "not json").expect("w");
        assert!(matches!(cache(&dir), Cache::UnknownLayout(_)));
        std::fs::write(dir.join("pods-c1-eth0"), libcni_entry("pods", "c1", "eth0")).expect("w");
        match cache(&dir) {
            Cache::Known(n) => assert_eq!(n.len(), 3, "every name counts once confirmed"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn confirms_reads_the_name_from_the_fields() {
        let e = libcni_entry("my-net", "abc", "eth0");
        assert!(confirms("my-net-abc-eth0", e.as_bytes()));
        assert!(!confirms("my-net-abc-eth1", e.as_bytes()));
        assert!(!confirms("abc-eth0", e.as_bytes()));
        let empty = libcni_entry("", "abc", "eth0");
        assert!(!confirms("-abc-eth0", empty.as_bytes()));
    }
}
