//! The default evaluation text: the llama.cpp docs of the pinned tree. A text the user
//! passes with `-f` replaces it; held-out texts are chosen per measurement (docs/JOURNAL.md).

use std::path::{Path, PathBuf};

fn docs_dir() -> Option<PathBuf> {
    let mut cands = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        // target/<profile>/tq -> repository root
        if let Some(repo) = exe.parent().and_then(Path::parent).and_then(Path::parent) {
            cands.push(repo.to_path_buf());
        }
    }
    cands.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."));
    if let Ok(cwd) = std::env::current_dir() {
        cands.push(cwd);
    }
    cands
        .into_iter()
        .map(|r| r.join("vendor/llama.cpp/docs"))
        .find(|d| d.is_dir())
}

fn collect_md(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            collect_md(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
    Ok(())
}

/// Concatenates the llama.cpp docs (every `*.md` under vendor/llama.cpp/docs, sorted)
/// into `dest`: the default evaluation text. Returns the path and a description.
pub fn docs_corpus(dest: &Path) -> Result<(PathBuf, String), String> {
    let dir = docs_dir().ok_or(
        "no text given and the llama.cpp docs (vendor/llama.cpp/docs) were not found next to \
         the repository of this executable; pass -f TEXT",
    )?;
    let mut files = Vec::new();
    collect_md(&dir, &mut files).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    files.sort();
    let mut text = String::new();
    for f in &files {
        text += &std::fs::read_to_string(f).map_err(|e| format!("reading {}: {e}", f.display()))?;
        text.push('\n');
    }
    std::fs::write(dest, text).map_err(|e| format!("writing {}: {e}", dest.display()))?;
    Ok((
        dest.to_path_buf(),
        format!("{} ({} *.md files)", dir.display(), files.len()),
    ))
}
