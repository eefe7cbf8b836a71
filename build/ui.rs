//! llama-server's web UI (the Svelte app in tools/ui): built with npm once per pinned
//! sdist into `<cache>/ui/<sdist sha256>/dist`, then copied to tools/ui/dist, where
//! upstream's scripts/ui-assets.cmake takes pre-built assets first and embeds them in
//! llama-server (so LLAMA_BUILD_UI / LLAMA_USE_PREBUILT_UI stay OFF: no npm inside cmake,
//! no download from Hugging Face). `TQ_WEB_UI=off` builds API-only; `TQ_WEB_UI=on`
//! makes a missing npm an error. Without npm the build says so once and goes on.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// What the `tq` binary is told (`TQ_WEB_UI_STATE`): `embedded`, or why not.
pub fn provide(src: &Path, sdist_sha256: &str) -> Result<String, String> {
    println!("cargo:rerun-if-env-changed=TQ_WEB_UI");
    let mode = std::env::var("TQ_WEB_UI").unwrap_or_else(|_| "auto".into());
    let dest = src.join("tools/ui/dist");
    let stamp = src.join("tools/ui/.turboquant-ui");
    // an API-only build must not embed what an earlier build copied here
    let api_only = |why: &str| {
        let _ = fs::remove_dir_all(&dest);
        let _ = fs::remove_file(&stamp);
        format!("api-only: {why}")
    };
    if mode == "off" {
        return Ok(api_only("built with TQ_WEB_UI=off"));
    }
    if mode != "auto" && mode != "on" {
        return Err(format!("TQ_WEB_UI={mode}: expected on, off or auto"));
    }
    let key = &sdist_sha256[..16];
    if fs::read_to_string(&stamp).ok().as_deref() == Some(key) && dest.join("index.html").exists() {
        return Ok("embedded".into());
    }
    let cache = super::cache_dir::cache_dir().join("ui").join(key);
    let dist = cache.join("dist");
    if !dist.join("index.html").exists() {
        if let Err(why) = npm_build(src, &cache) {
            if mode == "on" {
                return Err(format!("TQ_WEB_UI=on: {why}"));
            }
            println!(
                "cargo:warning=turboquant: llama-server is built API-only, without its web UI: \
                 {why}. For the chat page install Node.js 20+ with npm and rebuild with \
                 `TQ_WEB_UI=on cargo build --release`."
            );
            return Ok(api_only(&why));
        }
    }
    let _ = fs::remove_dir_all(&dest);
    sh(
        &format!("cp -R '{}' '{}'", dist.display(), dest.display()),
        "copying the cached web UI",
    )?;
    fs::write(&stamp, key).map_err(|e| format!("cannot write {}: {e}", stamp.display()))?;
    Ok("embedded".into())
}

/// `npm ci && npm run build` in a scratch copy of tools/ui; only the built assets are
/// kept (node_modules is hundreds of MB and never needed again for this sdist).
fn npm_build(src: &Path, cache: &Path) -> Result<(), String> {
    match Command::new("npm").arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => return Err("npm was not found".into()),
    }
    // per build process: two builds of the same sdist at once (two checkouts, or worktrees)
    // must not delete each other's node_modules; the first finished rename wins
    let work = cache.join(format!("work-{}", std::process::id()));
    let tmp = cache.join(format!("dist.tmp-{}", std::process::id()));
    let res = npm_build_in(src, cache, &work, &tmp);
    // a failed build leaves nothing behind either (node_modules is hundreds of MB)
    let _ = fs::remove_dir_all(&work);
    let _ = fs::remove_dir_all(&tmp);
    res
}

fn npm_build_in(src: &Path, cache: &Path, work: &Path, tmp: &Path) -> Result<(), String> {
    let _ = fs::remove_dir_all(work);
    let _ = fs::remove_dir_all(tmp);
    fs::create_dir_all(work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let t = Instant::now();
    sh(
        &format!(
            "tar -C '{}' --exclude=./node_modules --exclude=./dist -cf - . | tar -C '{}' -xf -",
            src.join("tools/ui").display(),
            work.display()
        ),
        "copying tools/ui",
    )?;
    sh_in(
        work,
        "npm ci --no-audit --no-fund --loglevel=error",
        "npm ci in tools/ui",
    )?;
    sh_in(
        work,
        &format!(
            "LLAMA_UI_OUT_DIR='{}' npm run build --loglevel=error",
            tmp.display()
        ),
        "npm run build in tools/ui",
    )?;
    if !tmp.join("index.html").exists() {
        return Err(format!(
            "npm run build left no {}/index.html",
            tmp.display()
        ));
    }
    if let Err(e) = fs::rename(tmp, cache.join("dist")) {
        // another build finished first: its assets are the same sdist's
        if !cache.join("dist/index.html").exists() {
            return Err(format!("cannot keep the web UI: {e}"));
        }
    }
    println!(
        "cargo:warning=turboquant: built llama-server's web UI with npm in {:.0} s (cached in {})",
        t.elapsed().as_secs_f64(),
        cache.display()
    );
    Ok(())
}

fn sh(script: &str, what: &str) -> Result<(), String> {
    sh_in(Path::new("."), script, what)
}

fn sh_in(dir: &Path, script: &str, what: &str) -> Result<(), String> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("{what}: cannot start sh: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = err.lines().rev().take(8).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(format!(
        "{what} failed ({}): {}",
        out.status,
        tail.join(" | ")
    ))
}
