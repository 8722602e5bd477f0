//! The parts of deploy/Dockerfile the manifests depend on: each stage's name, the files it
//! copies in, its user and its entrypoint. Hand-rolled: the Dockerfile grammar needed here is
//! a few instructions, and the tests need their values, not a linter's opinion (hadolint
//! gives that separately).

/// One `FROM ... AS name` stage.
#[derive(Debug, Default)]
pub struct Stage {
    pub name: String,
    pub base: String,
    /// Destinations of its COPY instructions.
    pub copies: Vec<String>,
    /// `USER uid[:gid]`, the last one.
    pub user: Option<(u32, Option<u32>)>,
    /// `ENTRYPOINT` in exec form.
    pub entrypoint: Vec<String>,
    /// Every `RUN`, continuation lines joined.
    pub runs: Vec<String>,
}

/// The instructions of a Dockerfile, `\` continuations joined, comments dropped.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
        } else {
            cur.push_str(t);
            out.push(std::mem::take(&mut cur));
        }
    }
    out
}

/// The stages of `text`, in order.
pub fn stages(text: &str) -> Result<Vec<Stage>, String> {
    let mut out: Vec<Stage> = Vec::new();
    for ins in instructions(text) {
        let (op, rest) = ins.split_once(' ').unwrap_or((ins.as_str(), ""));
        let rest = rest.trim();
        match op.to_ascii_uppercase().as_str() {
            "FROM" => {
                let words: Vec<&str> = rest.split_whitespace().collect();
                let name = match words.as_slice() {
                    [base, as_, name] if as_.eq_ignore_ascii_case("as") => (base, *name),
                    _ => return Err(format!("a stage without a name: FROM {rest}")),
                };
                out.push(Stage {
                    base: name.0.to_string(),
                    name: name.1.to_string(),
                    ..Stage::default()
                });
            }
            // build arguments for the FROM lines
            "ARG" if out.is_empty() => {}
            other => {
                let stage = out
                    .last_mut()
                    .ok_or_else(|| format!("{other} before any FROM"))?;
                match other {
                    "COPY" => {
                        let dest = rest
                            .split_whitespace()
                            .last()
                            .ok_or_else(|| format!("COPY without a destination: {ins}"))?;
                        stage.copies.push(dest.to_string());
                    }
                    "USER" => stage.user = Some(user(rest)?),
                    "ENTRYPOINT" => {
                        stage.entrypoint = serde_json::from_str(rest)
                            .map_err(|e| format!("ENTRYPOINT not in exec form ({e}): {rest}"))?;
                    }
                    "RUN" => stage.runs.push(rest.to_string()),
                    _ => {}
                }
            }
        }
    }
    Ok(out)
}

fn user(spec: &str) -> Result<(u32, Option<u32>), String> {
    let num = |s: &str| {
        s.parse::<u32>()
            .map_err(|_| format!("USER {spec}: give numeric IDs (runAsUser is numeric)"))
    };
    match spec.split_once(':') {
        Some((u, g)) => Ok((num(u)?, Some(num(g)?))),
        None => Ok((num(spec)?, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stages_copies_users_and_entrypoints() {
        let s = stages(
            "# c\nARG X=1\nFROM rust:1 AS build\nRUN a \\\n    && b\nFROM scratch AS app\n\
             COPY --from=build /out/app /usr/bin/app\nUSER 10:20\nENTRYPOINT [\"/usr/bin/app\"]\n",
        )
        .unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].runs, ["a  && b"]);
        assert_eq!(s[1].name, "app");
        assert_eq!(s[1].copies, ["/usr/bin/app"]);
        assert_eq!(s[1].user, Some((10, Some(20))));
        assert_eq!(s[1].entrypoint, ["/usr/bin/app"]);
        assert!(stages("FROM scratch AS a\nUSER nobody\n").is_err());
        assert!(stages("FROM scratch\n").is_err());
    }
}
