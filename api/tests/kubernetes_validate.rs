//! The generated CRDs pass `kubernetes-validate --strict` (PyPI; scripts/test.sh installs
//! it) against Kubernetes 1.33, the version the in-process API server speaks; and the tool
//! really checks (a CRD with an unknown field fails). This test fails, never skips, when the
//! tool is missing.
#![allow(clippy::too_many_lines)] // test code: the 100-line limit is for the product

use std::process::Command;

fn validate(yaml: &str, name: &str) -> (bool, String) {
    let path = std::env::temp_dir().join(format!("tidepool-{}-{name}.yaml", std::process::id()));
    std::fs::write(&path, yaml).unwrap();
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "--kubernetes-version", "1.33.0"])
        .arg(&path)
        .output();
    let _ = std::fs::remove_file(&path);
    let out = out.expect(
        "kubernetes-validate not found: install it with `pip install kubernetes-validate` \
         (scripts/test.sh does); this test does not skip",
    );
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn the_crds_pass_kubernetes_validate_strict() {
    let (ok, text) = validate(&tidepool_api::crds_yaml(), "crds");
    assert!(ok, "{text}");
    for crd in ["ippools", "ipamblocks", "ipamnodes"] {
        assert!(
            text.contains(&format!("customresourcedefinition/{crd}.ipam.tidepool.dev")),
            "{text}"
        );
    }
    let broken =
        tidepool_api::crds_yaml().replacen("  scope: Cluster", "  scope: Cluster\n  bogus: 1", 1);
    let (ok, text) = validate(&broken, "broken");
    assert!(!ok, "an unknown field must fail --strict: {text}");
}
