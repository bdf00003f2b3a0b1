//! What the Debian package ships besides the binary, made by the binary
//! itself (`deploy/debian/build.sh`): `dedupd man --out DIR` and
//! `dedupd completions SHELL`.

use tempfile::TempDir;

use crate::support::process::dedupd;

#[test]
fn man_writes_a_page_for_dedupd_and_for_every_subcommand() {
    let dir = TempDir::new().unwrap();
    let out = dedupd()
        .args(["man", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for page in [
        "dedupd.1",
        "dedupd-serve.1",
        "dedupd-reload.1",
        "dedupd-backup.1",
        "dedupd-restore.1",
        "dedupd-events-list.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(page))
            .unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(
            text.contains(".TH") && text.contains(".SH NAME"),
            "{page}: {text}"
        );
    }
    let reload = std::fs::read_to_string(dir.path().join("dedupd-reload.1")).unwrap();
    assert!(
        reload.contains("dedupd\\-reload") || reload.contains("dedupd reload"),
        "{reload}"
    );
    assert!(!dir.path().join("dedupd-help.1").exists());
}

#[test]
fn man_replaces_a_link_planted_where_a_page_goes_and_never_writes_through_it() {
    let dir = TempDir::new().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep me\n").unwrap();
    let pages = dir.path().join("pages");
    std::fs::create_dir(&pages).unwrap();
    std::os::unix::fs::symlink(&victim, pages.join("dedupd.1")).unwrap();

    let out = dedupd()
        .args(["man", "--out"])
        .arg(&pages)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me\n");
    let page = pages.join("dedupd.1");
    assert!(
        !std::fs::symlink_metadata(&page)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert!(std::fs::read_to_string(&page).unwrap().contains(".TH"));
}

#[test]
fn completions_name_the_subcommands_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef dedupd"),
        ("fish", "complete -c dedupd"),
    ] {
        let out = dedupd().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains(marker), "{shell}: no {marker:?}");
        for sub in ["serve", "reload", "backup", "stage-credentials"] {
            assert!(text.contains(sub), "{shell}: no {sub}");
        }
    }
    let out = dedupd().args(["completions", "tcsh"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value"));
}
