//! Every way an admin or a fleet tool changes the policy on disk, seen by the
//! watcher: each test starts a PolicyStore + watcher on a temp directory, changes
//! the files, and waits for the live policy (and the audit log) to follow.

#[path = "record_schema.rs"]
mod record_schema;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use metalift_daemon::audit::{AuditLog, Rotation};
use metalift_daemon::live_policy::store::PolicyStore;
use metalift_daemon::live_policy::watcher;
use metalift_policy::LoadOptions;
use serde_json::Value;
use tokio::sync::oneshot;

/// How long a change may take to show before a test gives up: generous, since the
/// machine is shared; a pass is usually well under a second.
const PATIENCE: Duration = Duration::from_secs(30);

/// A policy with `n` unlock rules.
fn policy_with_rules(n: usize) -> String {
    let mut text = String::from("version = 1\n\n[profile.apple7]\napple_family_max = 7\n");
    for i in 0..n {
        text.push_str(&format!(
            "\n[[rule]]\nid = \"rule-{i}\"\npath = \"/opt/tool-{i}/bin/*\"\nunlock = \"apple7\"\n"
        ));
    }
    text
}

/// A `policy.d/` file with one rule of its own.
fn dropin_rule(id: &str) -> String {
    format!("[[rule]]\nid = \"{id}\"\nname = \"{id}\"\nstock = true\n")
}

struct Fixture {
    _tmp: tempfile::TempDir,
    /// `<tmp>/etc`: holds policy.toml and policy.d/.
    etc: PathBuf,
    /// `<tmp>/etc/policy.toml`.
    policy: PathBuf,
    audit_path: PathBuf,
    store: Arc<PolicyStore>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Fixture {
    /// Starts with `policy.toml` holding `initial` (or absent), and the watcher running.
    fn start(initial: Option<&str>) -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let etc = tmp.path().join("etc");
        std::fs::create_dir(&etc).unwrap();
        let policy = etc.join("policy.toml");
        if let Some(text) = initial {
            std::fs::write(&policy, text).unwrap();
        }
        let audit_path = tmp.path().join("log/audit.jsonl");
        let audit = Arc::new(AuditLog::open(&audit_path, Rotation::default()).unwrap());
        let store =
            Arc::new(PolicyStore::load_initial(&policy, LoadOptions::default(), &audit).unwrap());
        let (stop, stopped) = oneshot::channel();
        let task = watcher::spawn(
            Arc::clone(&store),
            audit,
            // No periodic re-check: only the handling of file events can make a
            // change live here, so each test fails if its events are dropped.
            watcher::Timing {
                debounce: watcher::DEFAULT_DEBOUNCE,
                recheck: Duration::from_secs(3600),
                // Long, so that a slow editor's save below never outlasts it.
                delete_grace: Duration::from_secs(2),
            },
            async move {
                let _ = stopped.await;
            },
        );
        Fixture {
            _tmp: tmp,
            etc,
            policy,
            audit_path,
            store,
            stop: Some(stop),
            task: Some(task),
        }
    }

    fn rules(&self) -> usize {
        self.store.current().rule_count
    }

    /// Waits until `cond` holds for the store, or fails the test after [`PATIENCE`].
    async fn until(&self, what: &str, cond: impl Fn(&PolicyStore) -> bool) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while !cond(&self.store) {
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "gave up waiting for: {what} (rules = {}, last error = {:?})\naudit:\n{}",
                    self.rules(),
                    self.store.last_error(),
                    std::fs::read_to_string(&self.audit_path).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn audit(&self) -> Vec<Value> {
        record_schema::valid_records(&self.audit_path)
    }

    fn audit_of(&self, kind: &str) -> Vec<Value> {
        self.audit()
            .into_iter()
            .filter(|r| r["kind"] == kind)
            .collect()
    }

    /// The last `policy_loaded` record, which must describe the live policy.
    fn assert_last_load_is_live(&self, reason: &str) {
        let loaded = self.audit_of("policy_loaded");
        let last = loaded.last().expect("a policy_loaded record");
        let live = self.store.current();
        assert_eq!(last["sha256"], live.sha256.as_str());
        assert_eq!(last["rules"], live.rule_count);
        assert_eq!(last["reason"], reason);
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

/// Writes `text` to a temp file beside `path` and renames it over `path`, as editors
/// and config-management tools do.
fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("toml.tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_atomic_rename_over_then_the_new_policy_is_live_and_audited() {
    let fx = Fixture::start(Some(&policy_with_rules(1)));
    write_atomically(&fx.policy, &policy_with_rules(2));
    fx.until("2 rules", |s| s.current().rule_count == 2).await;
    fx.assert_last_load_is_live("change");
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_in_place_rewrite_then_the_new_policy_is_live() {
    let fx = Fixture::start(Some(&policy_with_rules(1)));
    // Same inode: truncate and write, as `echo > policy.toml` or vim without backups do.
    std::fs::write(&fx.policy, policy_with_rules(3)).unwrap();
    fx.until("3 rules", |s| s.current().rule_count == 3).await;
    fx.assert_last_load_is_live("change");
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_an_in_place_write_that_pauses_halfway_then_only_the_whole_file_goes_live() {
    use std::io::Write;
    let fx = Fixture::start(Some(&policy_with_rules(2)));
    let whole = policy_with_rules(3);
    // Cut right after the first rule: the first half alone is a valid 1-rule policy.
    let cut = whole.find("\n[[rule]]\nid = \"rule-1\"").unwrap();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&fx.policy)
        .unwrap();
    file.write_all(&whole.as_bytes()[..cut]).unwrap();
    // Far longer than the debounce: the writer is slow, not done.
    tokio::time::sleep(Duration::from_millis(150)).await;
    file.write_all(&whole.as_bytes()[cut..]).unwrap();
    drop(file);
    fx.until("3 rules", |s| s.current().rule_count == 3).await;
    fx.assert_last_load_is_live("change");
    let loads: Vec<_> = fx
        .audit_of("policy_loaded")
        .iter()
        .map(|r| r["rules"].clone())
        .collect();
    assert_eq!(loads, [2, 3], "the half-written file never went live");
    assert!(fx.audit_of("policy_rejected").is_empty());
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_a_writer_that_keeps_the_policy_open_then_what_it_wrote_goes_live_anyway() {
    use std::io::Write;
    let fx = Fixture::start(Some(&policy_with_rules(2)));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&fx.policy)
        .unwrap();
    file.write_all(policy_with_rules(4).as_bytes()).unwrap();
    // Still open: after OPEN_WRITE_GRACE without events the file is read anyway.
    fx.until("4 rules", |s| s.current().rule_count == 4).await;
    drop(file);
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_delete_then_the_last_good_policy_stays_live_and_recreate_brings_the_new_rules() {
    let fx = Fixture::start(Some(&policy_with_rules(2)));
    std::fs::remove_file(&fx.policy).unwrap();
    // After the fixture's (long) grace for the file to come back: refused like a
    // broken file, the two rules kept.
    fx.until("the deletion refused", |s| {
        s.published().refusal.as_ref().is_some_and(|r| r.missing)
    })
    .await;
    assert_eq!(fx.rules(), 2, "the last good policy stays live");
    fx.assert_last_load_is_live("start");
    assert_eq!(fx.audit_of("policy_rejected").len(), 1);

    std::fs::write(&fx.policy, policy_with_rules(1)).unwrap();
    fx.until("1 rule", |s| s.current().rule_count == 1).await;
    fx.assert_last_load_is_live("change");
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_symlink_swap_then_the_new_target_is_live_and_its_edits_are_seen() {
    // policy.toml -> <tmp>/versions/a.toml, then re-pointed at b.toml with `ln -sfn`
    // semantics (a new link renamed over the old one).
    let fx = Fixture::start(None);
    let versions = fx.etc.parent().unwrap().join("versions");
    std::fs::create_dir(&versions).unwrap();
    std::fs::write(versions.join("a.toml"), policy_with_rules(1)).unwrap();
    std::fs::write(versions.join("b.toml"), policy_with_rules(2)).unwrap();
    std::os::unix::fs::symlink(versions.join("a.toml"), &fx.policy).unwrap();
    fx.until("a.toml live", |s| s.current().rule_count == 1)
        .await;

    let new_link = fx.etc.join(".policy.toml.new");
    std::os::unix::fs::symlink(versions.join("b.toml"), &new_link).unwrap();
    std::fs::rename(&new_link, &fx.policy).unwrap();
    fx.until("b.toml live", |s| s.current().rule_count == 2)
        .await;
    fx.assert_last_load_is_live("change");

    // An in-place edit of the target changes no link: only the watch on the
    // target's directory sees it.
    std::fs::write(versions.join("b.toml"), policy_with_rules(4)).unwrap();
    fx.until("edited b.toml live", |s| s.current().rule_count == 4)
        .await;
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_policy_d_created_after_start_then_files_added_and_removed_are_seen() {
    let fx = Fixture::start(Some(&policy_with_rules(1)));
    let dropins = fx.etc.join("policy.d");
    std::fs::create_dir(&dropins).unwrap();
    std::fs::write(dropins.join("10-fleet.toml"), dropin_rule("fleet")).unwrap();
    fx.until("policy.d rule added", |s| s.current().rule_count == 2)
        .await;
    fx.assert_last_load_is_live("change");

    std::fs::write(dropins.join("20-more.toml"), dropin_rule("more")).unwrap();
    fx.until("second drop-in added", |s| s.current().rule_count == 3)
        .await;

    std::fs::remove_file(dropins.join("10-fleet.toml")).unwrap();
    fx.until("drop-in removed", |s| s.current().rule_count == 2)
        .await;
    let live = fx.store.current();
    assert!(live.policy.rule_count() == 2);
    fx.assert_last_load_is_live("change");
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_invalid_edit_then_last_good_policy_stays_live_and_the_refusal_is_audited() {
    let fx = Fixture::start(Some(&policy_with_rules(2)));
    let good = fx.store.current();

    // Line 3, column 8: an unknown mode.
    let bad = "version = 1\n\nmode = \"loud\"\n";
    write_atomically(&fx.policy, bad);
    fx.until("a reload error", |s| s.last_error().is_some())
        .await;

    let live = fx.store.current();
    assert_eq!(live.sha256, good.sha256, "the last good policy stays live");
    assert_eq!(live.rule_count, 2);
    let error = fx.store.last_error().unwrap();
    let location = format!("{}:3:", fx.policy.display());
    assert!(error.contains(&location), "{error}");

    let rejected = fx.audit_of("policy_rejected");
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0]["kept_sha256"], good.sha256.as_str());
    assert!(rejected[0]["sha256"]
        .as_str()
        .is_some_and(|s| s.len() == 64));
    assert!(rejected[0]["errors"][0]
        .as_str()
        .is_some_and(|e| e.starts_with(&location)));

    // Fixing the file brings the new policy in and clears the error.
    write_atomically(&fx.policy, &policy_with_rules(3));
    fx.until("fixed policy live", |s| s.current().rule_count == 3)
        .await;
    assert!(fx.store.last_error().is_none());
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_group_writable_policy_then_it_is_refused_audited_and_last_good_kept() {
    let fx = Fixture::start(Some(&policy_with_rules(1)));
    let good = fx.store.current();
    // The new content would have 2 rules; the mode alone must keep it out.
    let staged = fx.etc.join("staged.toml.part");
    std::fs::write(&staged, policy_with_rules(2)).unwrap();
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o664)).unwrap();
    std::fs::rename(&staged, &fx.policy).unwrap();

    fx.until("a permission error", |s| s.last_error().is_some())
        .await;
    assert_eq!(fx.store.current().sha256, good.sha256);
    let error = fx.store.last_error().unwrap();
    assert!(error.contains("refused"), "{error}");
    let rejected = fx.audit_of("policy_rejected");
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0]["kept_sha256"], good.sha256.as_str());

    // chmod back to 0644: accepted (a metadata change is an event too).
    std::fs::set_permissions(&fx.policy, std::fs::Permissions::from_mode(0o644)).unwrap();
    fx.until("2 rules", |s| s.current().rule_count == 2).await;
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_drop_in_owned_by_another_user_then_it_is_refused_and_last_good_kept() {
    let fx = Fixture::start(Some(&policy_with_rules(1)));
    let good = fx.store.current();
    let dropins = fx.etc.join("policy.d");
    std::fs::create_dir(&dropins).unwrap();
    let staged = fx.etc.join("nobody.part");
    std::fs::write(&staged, dropin_rule("nobody")).unwrap();
    std::os::unix::fs::chown(&staged, Some(65534), None).unwrap();
    std::fs::rename(&staged, dropins.join("50-nobody.toml")).unwrap();

    fx.until("an ownership error", |s| s.last_error().is_some())
        .await;
    assert_eq!(fx.store.current().sha256, good.sha256);
    let error = fx.store.last_error().unwrap();
    assert!(error.contains("50-nobody.toml"), "{error}");
    assert_eq!(fx.audit_of("policy_rejected").len(), 1);
    fx.stop().await;
}

// ---------------------------------------------------------------------------
// One test per way a file gets replaced. The fixture's periodic re-check is off,
// so each passes only through the handling of its own file events.
// ---------------------------------------------------------------------------

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_vims_backup_rename_save_then_the_new_policy_is_live_and_never_deleted() {
    let fx = Fixture::start(Some(&policy_with_rules(1)));
    // vim with `backupcopy=no`: rename the original away, write a new file under
    // the name, delete the backup.
    let backup = fx.etc.join("policy.toml~");
    std::fs::rename(&fx.policy, &backup).unwrap();
    // A slow save (fsync on a busy disk): the gap outlasts the debounce.
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::fs::write(&fx.policy, policy_with_rules(2)).unwrap();
    std::fs::remove_file(&backup).unwrap();
    fx.until("2 rules", |s| s.current().rule_count == 2).await;
    fx.assert_last_load_is_live("change");
    // The moment without a policy.toml never made everything stock.
    let reasons: Vec<Value> = fx
        .audit_of("policy_loaded")
        .iter()
        .map(|r| r["reason"].clone())
        .collect();
    assert!(!reasons.contains(&Value::from("deleted")), "{reasons:?}");
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_cp_over_the_policy_then_the_new_policy_is_live() {
    let fx = Fixture::start(Some(&policy_with_rules(1)));
    let staging = fx.etc.parent().unwrap().join("staging");
    std::fs::create_dir(&staging).unwrap();
    std::fs::write(staging.join("new.toml"), policy_with_rules(3)).unwrap();
    // cp truncates and writes the existing inode.
    std::fs::copy(staging.join("new.toml"), &fx.policy).unwrap();
    fx.until("3 rules", |s| s.current().rule_count == 3).await;
    fx.assert_last_load_is_live("change");
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_mv_from_another_directory_over_the_policy_then_the_new_policy_is_live() {
    let fx = Fixture::start(Some(&policy_with_rules(1)));
    let staging = fx.etc.parent().unwrap().join("staging");
    std::fs::create_dir(&staging).unwrap();
    std::fs::write(staging.join("new.toml"), policy_with_rules(4)).unwrap();
    // Only the arrival under the policy's name is seen in etc/.
    std::fs::rename(staging.join("new.toml"), &fx.policy).unwrap();
    fx.until("4 rules", |s| s.current().rule_count == 4).await;
    fx.assert_last_load_is_live("change");
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_a_kubernetes_configmap_data_swap_then_the_new_version_is_live() {
    // etc/policy.toml -> ..data/policy.toml, ..data -> ..v1 (what kubelet writes).
    let fx = Fixture::start(None);
    let v1 = fx.etc.join("..v1");
    std::fs::create_dir(&v1).unwrap();
    std::fs::write(v1.join("policy.toml"), policy_with_rules(1)).unwrap();
    std::os::unix::fs::symlink("..v1", fx.etc.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/policy.toml", &fx.policy).unwrap();
    fx.until("..v1 live", |s| s.current().rule_count == 1).await;

    // A new version directory and a new `..data` link renamed over the old one:
    // policy.toml itself is never touched.
    let v2 = fx.etc.join("..v2");
    std::fs::create_dir(&v2).unwrap();
    std::fs::write(v2.join("policy.toml"), policy_with_rules(5)).unwrap();
    std::os::unix::fs::symlink("..v2", fx.etc.join("..data_tmp")).unwrap();
    std::fs::rename(fx.etc.join("..data_tmp"), fx.etc.join("..data")).unwrap();
    // The swap alone must do it (kubelet removes the old version only later).
    fx.until("..v2 live", |s| s.current().rule_count == 5).await;
    fx.assert_last_load_is_live("change");
    std::fs::remove_dir_all(&v1).unwrap();
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_a_link_in_the_middle_of_the_chain_swapped_elsewhere_then_the_new_target_is_live() {
    // etc/policy.toml -> <tmp>/app/current/policy.toml, current -> releases/1:
    // a deploy re-points `current`, in a directory etc/ knows nothing about.
    let fx = Fixture::start(None);
    let app = fx.etc.parent().unwrap().join("app");
    for release in ["1", "2"] {
        let dir = app.join("releases").join(release);
        std::fs::create_dir_all(&dir).unwrap();
        let rules = if release == "1" { 1 } else { 6 };
        std::fs::write(dir.join("policy.toml"), policy_with_rules(rules)).unwrap();
    }
    std::os::unix::fs::symlink("releases/1", app.join("current")).unwrap();
    std::os::unix::fs::symlink(app.join("current/policy.toml"), &fx.policy).unwrap();
    fx.until("release 1 live", |s| s.current().rule_count == 1)
        .await;

    std::os::unix::fs::symlink("releases/2", app.join("current.new")).unwrap();
    std::fs::rename(app.join("current.new"), app.join("current")).unwrap();
    fx.until("release 2 live", |s| s.current().rule_count == 6)
        .await;
    fx.assert_last_load_is_live("change");

    // And an in-place edit of the new target, in yet another directory.
    std::fs::write(app.join("releases/2/policy.toml"), policy_with_rules(7)).unwrap();
    fx.until("edited release 2 live", |s| s.current().rule_count == 7)
        .await;
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_the_policy_directory_deleted_and_created_again_then_the_new_policy_is_live() {
    let fx = Fixture::start(Some(&policy_with_rules(2)));
    std::fs::remove_dir_all(&fx.etc).unwrap();
    fx.until("the deletion refused, the last good kept", |s| {
        s.published().refusal.as_ref().is_some_and(|r| r.missing) && s.current().rule_count == 2
    })
    .await;
    // The old directory's watch died with it: only its parent sees the new one.
    std::fs::create_dir(&fx.etc).unwrap();
    std::fs::write(&fx.policy, policy_with_rules(3)).unwrap();
    fx.until("3 rules", |s| s.current().rule_count == 3).await;
    fx.assert_last_load_is_live("change");

    // And an edit in the re-created directory is seen too.
    write_atomically(&fx.policy, &policy_with_rules(4));
    fx.until("4 rules", |s| s.current().rule_count == 4).await;
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_policy_d_replaced_by_a_symlinked_directory_then_its_drop_ins_are_live() {
    let fx = Fixture::start(Some(&policy_with_rules(1)));
    let fleet = fx.etc.parent().unwrap().join("fleet");
    std::fs::create_dir(&fleet).unwrap();
    std::fs::write(fleet.join("10-a.toml"), dropin_rule("a")).unwrap();
    std::os::unix::fs::symlink(&fleet, fx.etc.join("policy.d")).unwrap();
    fx.until("drop-in through the link", |s| s.current().rule_count == 2)
        .await;
    // A drop-in added in the link's target directory.
    std::fs::write(fleet.join("20-b.toml"), dropin_rule("b")).unwrap();
    fx.until("second drop-in", |s| s.current().rule_count == 3)
        .await;
    fx.stop().await;
}

#[tokio::test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
async fn given_files_written_beside_the_policy_then_only_the_policy_edit_is_audited() {
    let fx = Fixture::start(Some(&policy_with_rules(1)));
    let before = fx.audit().len();
    for i in 0..20 {
        std::fs::write(fx.etc.join("notes.txt"), format!("{i}")).unwrap();
        std::fs::write(fx.etc.join(".policy.toml.swp"), format!("{i}")).unwrap();
    }
    // Then a real edit, which must be the only thing audited.
    write_atomically(&fx.policy, &policy_with_rules(2));
    fx.until("2 rules", |s| s.current().rule_count == 2).await;
    assert_eq!(fx.audit().len(), before + 1, "{:?}", fx.audit());
    fx.stop().await;
}
