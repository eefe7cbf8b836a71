//! The evaluation texts, both from the pinned llama.cpp tree: the docs (every `*.md` of
//! vendor/llama.cpp/docs, the default of `tq eval` and `tq capture` and the text the tests
//! use) and the held-out tools text (every vendor/llama.cpp/tools/*/README.md, which no
//! setting here was chosen on; `tq results` reports both). A text the user passes with `-f`
//! replaces them.

use std::path::{Path, PathBuf};

/// The repository this executable was built in (target/<profile>/tq), else the source
/// tree it was compiled from, else the current directory: the first that holds
/// vendor/llama.cpp.
pub fn repo_root() -> Option<PathBuf> {
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
        .find(|r| r.join("vendor/llama.cpp/docs").is_dir())
}

fn docs_dir() -> Option<PathBuf> {
    repo_root().map(|r| r.join("vendor/llama.cpp/docs"))
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
    concat(&mut files, dest)?;
    Ok((
        dest.to_path_buf(),
        format!("{} ({} *.md files)", dir.display(), files.len()),
    ))
}

/// Concatenates every `vendor/llama.cpp/tools/*/README.md` (sorted by path) into `dest`:
/// the held-out text of `tq results`. Returns the path and a description.
pub fn tools_corpus(dest: &Path) -> Result<(PathBuf, String), String> {
    let dir = repo_root()
        .map(|r| r.join("vendor/llama.cpp/tools"))
        .ok_or("the llama.cpp tree (vendor/llama.cpp) was not found next to the repository of this executable")?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path().join("README.md")))
        .filter(|p| p.is_file())
        .collect();
    concat(&mut files, dest)?;
    Ok((
        dest.to_path_buf(),
        format!("{}/*/README.md ({} files)", dir.display(), files.len()),
    ))
}

/// Writes `files`, sorted by path, one after another (a newline after each) into `dest`.
fn concat(files: &mut [PathBuf], dest: &Path) -> Result<(), String> {
    files.sort();
    let mut text = String::new();
    for f in files.iter() {
        text += &std::fs::read_to_string(f).map_err(|e| format!("reading {}: {e}", f.display()))?;
        text.push('\n');
    }
    std::fs::write(dest, text).map_err(|e| format!("writing {}: {e}", dest.display()))
}
