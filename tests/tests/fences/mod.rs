//! The shell blocks of README.md and docs/*.md, as `docs.rs` and `quickstart.rs` run them.
//!
//! A block fenced ```` ```sh ```` or ```` ```bash ```` is a command to run from the repository
//! root. A tag after the language says why a block cannot run there (`docs.rs`' `TAGS`).
//! The one rewrite before running is `SUBSTITUTION`: `cargo run [--release] -p P [--bin X] --`
//! becomes the binary X (P without `--bin`) that the workspace's test build already made, next
//! to this crate's own binaries (`target/debug/X`): no nested cargo (it would wait on the build lock
//! the running `cargo test` holds) and no release build.

use std::path::{Path, PathBuf};

/// The one rewrite, as the tests print it.
pub const SUBSTITUTION: &str =
    "`cargo run [--release] -p P [--bin X] --` → target/debug/X (X = P without --bin)";

/// One fenced block.
#[derive(Debug, Clone)]
pub struct Fence {
    /// File (relative to the repository root) and the line of its opening fence.
    pub at: String,
    pub lang: String,
    pub tag: Option<String>,
    pub body: String,
}

impl Fence {
    pub fn is_shell(&self) -> bool {
        matches!(self.lang.as_str(), "sh" | "bash")
    }
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository root")
        .to_path_buf()
}

/// Every fenced block of one file.
pub fn fences(file: &str) -> Vec<Fence> {
    let text = std::fs::read_to_string(repo().join(file)).expect("read a doc");
    let mut out = Vec::new();
    let mut open: Option<(usize, String, Option<String>, Vec<&str>)> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => {
                let mut words = info.split_whitespace();
                let lang = words.next().unwrap_or("").to_string();
                open = Some((i + 1, lang, words.next().map(str::to_string), Vec::new()));
            }
            (Some(_), Some("")) => {
                let (at, lang, tag, body) = open.take().unwrap();
                out.push(Fence {
                    at: format!("{file}:{at}"),
                    lang,
                    tag,
                    body: body.join("\n") + "\n",
                });
            }
            (Some((.., body)), _) => body.push(line),
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{file}: a fence is never closed");
    out
}

/// Where the workspace's binaries are: next to this crate's own.
pub fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_tidepool-apiserver"))
        .parent()
        .expect("the binaries' directory")
        .to_path_buf()
}

/// `SUBSTITUTION` applied to a block; panics naming the build command when a binary it
/// names is missing.
pub fn substitute(body: &str) -> String {
    let re = regex::Regex::new(r"cargo run(?: --release)? -p (\S+)(?: --bin (\S+))? --")
        .expect("the pattern");
    re.replace_all(body, |c: &regex::Captures| {
        let package = &c[1];
        let name = c.get(2).map_or(package, |m| m.as_str());
        let bin = bin_dir().join(name);
        assert!(
            bin.is_file(),
            "{} not found: build it first (`cargo build -p {package} --bin {name}`, same \
             CARGO_TARGET_DIR; `cargo test --workspace` builds it)",
            bin.display()
        );
        bin.display().to_string()
    })
    .into_owned()
}
