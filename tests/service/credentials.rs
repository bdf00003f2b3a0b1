//! `dedupd stage-credentials`, as the unit runs it (as root) before each
//! start and reload: root-only files copied for the service's user, a
//! rotated one replacing its copy, a removed one's copy gone, and a file
//! that should not be trusted refusing the whole stage with the copies
//! left as they were.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use tempfile::TempDir;

use crate::support::process::dedupd;

/// The service's dynamic user, as far as the files can tell.
const SERVICE_UID: u32 = 61_999;

/// `/etc/dedupd/credentials` and the runtime directory `/run/dedupd`
/// (owned by the service's user), in a temp dir.
fn dirs() -> (TempDir, std::path::PathBuf, std::path::PathBuf) {
    let root = TempDir::new().unwrap();
    let from = root.path().join("etc-credentials");
    std::fs::create_dir(&from).unwrap();
    std::fs::set_permissions(&from, std::fs::Permissions::from_mode(0o700)).unwrap();
    let run = root.path().join("run-dedupd");
    std::fs::create_dir(&run).unwrap();
    std::os::unix::fs::chown(&run, Some(SERVICE_UID), Some(SERVICE_UID)).unwrap();
    let to = run.join("credentials");
    (root, from, to)
}

fn put(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

fn stage(from: &Path, to: &Path) -> std::process::Output {
    dedupd()
        .arg("stage-credentials")
        .arg("--from")
        .arg(from)
        .arg("--to")
        .arg(to)
        .output()
        .unwrap()
}

/// Each staged file: its text, mode and owner.
fn staged(to: &Path) -> Vec<(String, String, u32, u32)> {
    let mut files: Vec<_> = std::fs::read_dir(to)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read_to_string(e.path()).unwrap(),
                meta.mode() & 0o777,
                meta.uid(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn credentials_are_copied_for_the_service_user_and_follow_rotations_and_removals() {
    let (_root, from, to) = dirs();
    put(&from, "api-tokens", "token-one\n");
    put(&from, "sume-secret", "whsec_one\n");
    put(&from, ".api-tokens.swp", "an editor's file\n");
    let out = stage(&from, &to);
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("staged 2 credential(s)"),
        "{out:?}"
    );
    assert_eq!(
        staged(&to),
        [
            (
                "api-tokens".into(),
                "token-one\n".into(),
                0o400,
                SERVICE_UID
            ),
            (
                "sume-secret".into(),
                "whsec_one\n".into(),
                0o400,
                SERVICE_UID
            ),
        ]
    );
    let dir = std::fs::metadata(&to).unwrap();
    assert_eq!((dir.uid(), dir.mode() & 0o777), (SERVICE_UID, 0o700));

    // A rotation and a removal, staged again (the reload's first step).
    put(&from, "api-tokens", "token-two\n");
    std::fs::remove_file(from.join("sume-secret")).unwrap();
    assert!(stage(&from, &to).status.success());
    assert_eq!(
        staged(&to),
        [(
            "api-tokens".into(),
            "token-two\n".into(),
            0o400,
            SERVICE_UID
        )]
    );
}

/// Puts a file named `other` that must not be staged in a directory.
type MakeBad<'a> = dyn Fn(&Path) + 'a;

#[test]
fn a_file_that_cannot_be_trusted_refuses_the_stage_and_the_copies_stay() {
    let (root, from, to) = dirs();
    put(&from, "api-tokens", "token-one\n");
    assert!(stage(&from, &to).status.success());
    let before = staged(&to);

    put(&from, "api-tokens", "token-two\n");
    let cases: [(&str, &MakeBad<'_>, &str); 4] = [
        (
            "world-writable",
            &|from| {
                put(from, "other", "x\n");
                let p = from.join("other");
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
            },
            "can be written by other users",
        ),
        (
            "a link",
            &|from| {
                std::os::unix::fs::symlink(root.path().join("elsewhere"), from.join("other"))
                    .unwrap()
            },
            "is a link",
        ),
        (
            "too large",
            &|from| put(from, "other", &"x".repeat(2 << 20)),
            "more than a credential's",
        ),
        (
            "another user's",
            &|from| {
                put(from, "other", "x\n");
                std::os::unix::fs::chown(from.join("other"), Some(4242), None).unwrap();
            },
            "belongs to uid 4242",
        ),
    ];
    for (what, make, says) in cases {
        make(&from);
        let out = stage(&from, &to);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: staged: {stderr}");
        assert!(
            stderr.contains(says) && stderr.contains("nothing was staged"),
            "{what}: {stderr}"
        );
        assert_eq!(staged(&to), before, "{what}: the copies changed");
        std::fs::remove_file(from.join("other")).unwrap();
    }
    // A directory others may write is refused too.
    std::fs::set_permissions(&from, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = stage(&from, &to);
    assert!(!out.status.success());
    assert_eq!(staged(&to), before);
}

/// The runtime directory is the service's: a compromised service could
/// plant links there for the next stage, run as root, to follow. None is
/// followed: a link in place of the directory is refused, and links
/// inside it are replaced or removed, their targets untouched.
#[test]
fn links_planted_in_the_runtime_directory_lead_nowhere() {
    let (root, from, to) = dirs();
    put(&from, "api-tokens", "token-one\n");
    let outside = root.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let victim = outside.join("keep");
    std::fs::write(&victim, "keep\n").unwrap();
    let mode = std::fs::metadata(&victim).unwrap().mode() & 0o777;
    let untouched = |outside: &Path| {
        let names: Vec<_> = std::fs::read_dir(outside)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["keep"]);
        assert_eq!(
            std::fs::read_to_string(outside.join("keep")).unwrap(),
            "keep\n"
        );
        let meta = std::fs::metadata(outside.join("keep")).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (0, mode));
    };

    // A link in place of the directory, and one in place of the staging
    // directory: each is replaced, never followed.
    std::os::unix::fs::symlink(&outside, &to).unwrap();
    let staging = to.with_file_name(".credentials.staging");
    std::os::unix::fs::symlink(&outside, &staging).unwrap();
    let out = stage(&from, &to);
    assert!(out.status.success(), "{out:?}");
    untouched(&outside);
    assert!(!std::fs::symlink_metadata(&to).unwrap().is_symlink());
    assert!(
        std::fs::symlink_metadata(&staging).is_err(),
        "the staging name is left"
    );

    // Links and a tree the service's user put in the directory: the new
    // set replaces it whole, and none is followed.
    for name in ["api-tokens", "stale"] {
        let _ = std::fs::remove_file(to.join(name));
        std::os::unix::fs::symlink(&victim, to.join(name)).unwrap();
    }
    std::fs::create_dir_all(to.join("junk/deeper")).unwrap();
    std::os::unix::fs::symlink(&outside, to.join("junk/deeper/out")).unwrap();
    let out = stage(&from, &to);
    assert!(out.status.success(), "{out:?}");
    untouched(&outside);
    assert_eq!(
        staged(&to),
        [(
            "api-tokens".into(),
            "token-one\n".into(),
            0o400,
            SERVICE_UID
        )]
    );
}

/// A stage refused after some files were read (a FIFO last in the list:
/// it would never end a read) leaves the set staged before whole: every
/// file as it was, none added.
#[test]
fn a_stage_that_fails_leaves_the_set_staged_before() {
    let (_root, from, to) = dirs();
    put(&from, "api-tokens", "token-one\n");
    assert!(stage(&from, &to).status.success());
    let before = staged(&to);
    put(&from, "api-tokens", "token-two\n");
    put(&from, "sume-secrets", "whsec_two\n");
    let fifo = from.join("zz-fifo");
    crate::support::process::mkfifo(&fifo);
    let out = stage(&from, &to);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not a plain file"),
        "{out:?}"
    );
    assert_eq!(staged(&to), before);
}

/// The runtime directory full (a real 64 KiB tmpfs, as `/run` can be) in
/// the middle of writing the new set: the stage fails saying so, the set
/// staged before stays whole, and no half-written directory is left.
/// Root only (it mounts the tmpfs): `.ci/run` runs it as root.
#[test]
#[ignore = "mounts a tmpfs: root only; .ci/run runs it"]
fn a_full_runtime_directory_leaves_the_set_staged_before() {
    let (_root, from, to) = dirs();
    let run = to.parent().unwrap().to_owned();
    let status = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs"])
        .arg(&run)
        .status()
        .unwrap();
    assert!(status.success(), "mounting a tmpfs needs root");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(run.clone());
    std::os::unix::fs::chown(&run, Some(SERVICE_UID), Some(SERVICE_UID)).unwrap();

    put(&from, "api-tokens", "token-one\n");
    assert!(stage(&from, &to).status.success());
    let before = staged(&to);
    put(&from, "api-tokens", "token-two\n");
    put(&from, "big", &"x".repeat(100 << 10));
    let out = stage(&from, &to);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "staged onto a full disk");
    assert!(
        stderr.contains("nothing was staged") && stderr.contains("No space left"),
        "{stderr}"
    );
    assert_eq!(staged(&to), before);
    let left: Vec<_> = std::fs::read_dir(&run)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["credentials"], "a half-written set is left");
}
