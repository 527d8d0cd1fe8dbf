//! The `/dev` and `/sys` entries of RDMA devices, for programs that look for them.
//!
//! UCX skips a verbs device unless `/dev/infiniband/<dev_name>` is a character device the
//! process may read and write (`uct_ib_device_is_accessible`), and takes each GID's RoCE
//! version from `/sys/class/infiniband/<dev>/ports/1/gid_attrs/types/<i>` (without it, RoCE
//! v1: its UD transport then drops every IPv4 datagram, whose GRH it reads as an IB GRH).
//! softrdma needs neither, so a host without RDMA has neither. `softrdma run` provides them
//! for the command it runs only: in a private mount namespace (inside a user namespace that
//! maps the caller's uid and gid to themselves, when not root), `/dev` and `/sys/class` become
//! tmpfs with the original entries bound back, plus `/dev/infiniband/softrdma<N>` bound to
//! `/dev/null` and each device's sysfs tree (`softrdma_verbs::device::sysfs_files`) under
//! `/sys/class/infiniband`. Nothing outside the command's process tree sees them; the command
//! keeps its uid.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::unistd::{getgid, getuid};

/// Why the nodes could not be provided (the command then runs without them).
#[derive(Debug, thiserror::Error)]
pub enum DevNodeError {
    #[error("unshare({what}): {source} (user namespaces disabled? see sysctl user.max_user_namespaces)")]
    Unshare { what: &'static str, source: nix::Error },
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("mount {what} on {}: {source}", path.display())]
    Mount {
        what: String,
        path: PathBuf,
        source: nix::Error,
    },
}

/// What [`provide`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Provided {
    /// The host already has `/dev/infiniband/softrdma0`: nothing to do.
    AlreadyThere,
    /// This many nodes, and the sysfs trees of these devices, exist in the command's view.
    Created { nodes: usize, devices: Vec<String> },
}

/// Device nodes for `count` devices (`softrdma0..`) and the devices' sysfs trees, unless the
/// host has them. Must run while the process is single-threaded (a user namespace requires
/// it), before the command's exec.
pub fn provide(count: usize) -> Result<Provided, DevNodeError> {
    if is_char_device(Path::new("/dev/infiniband/softrdma0")) {
        return Ok(Provided::AlreadyThere);
    }
    let (uid, gid) = (getuid(), getgid());
    if uid.is_root() {
        unshare(CloneFlags::CLONE_NEWNS).map_err(|source| DevNodeError::Unshare {
            what: "CLONE_NEWNS",
            source,
        })?;
    } else {
        unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).map_err(|source| DevNodeError::Unshare {
            what: "CLONE_NEWUSER|CLONE_NEWNS",
            source,
        })?;
        write("/proc/self/setgroups", "deny")?;
        write("/proc/self/uid_map", &format!("{uid} {uid} 1"))?;
        write("/proc/self/gid_map", &format!("{gid} {gid} 1"))?;
    }
    do_mount(
        None,
        Path::new("/"),
        None,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        "/ private",
    )?;
    with_original(Path::new("/dev"), |old| rebuild_dev(old, count))?;
    // after the unshare: listing the devices may start threads
    let devices = softrdma_verbs::device::list_devices().unwrap_or_default();
    if Path::new("/sys/class/infiniband").exists() {
        tracing::debug!("softrdma run: the host has /sys/class/infiniband: left as it is");
    } else {
        with_original(Path::new("/sys/class"), |old| rebuild_sys_class(old, &devices))?;
    }
    Ok(Provided::Created {
        nodes: count,
        devices: devices.into_iter().map(|d| d.name).collect(),
    })
}

/// Runs `f` with `dir`'s original tree bound at a temporary path, which is removed after.
fn with_original(dir: &Path, f: impl FnOnce(&Path) -> Result<(), DevNodeError>) -> Result<(), DevNodeError> {
    let name = dir.to_string_lossy().replace('/', "-");
    let old = std::env::temp_dir().join(format!("softrdma{name}-{}", std::process::id()));
    std::fs::create_dir_all(&old).map_err(|source| io("create", &old, source))?;
    let result = do_mount(Some(dir), &old, None, MsFlags::MS_BIND | MsFlags::MS_REC, "(bind)").and_then(|()| f(&old));
    let _ = umount2(&old, MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(&old);
    result
}

/// A tmpfs over `dir` holding every entry of the original (reached through `old`).
fn cover(dir: &Path, old: &Path) -> Result<(), DevNodeError> {
    mount(
        Some(Path::new("tmpfs")),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID,
        Some("mode=755"),
    )
    .map_err(|source| DevNodeError::Mount {
        what: "a tmpfs".into(),
        path: dir.to_path_buf(),
        source,
    })?;
    let entries = std::fs::read_dir(old).map_err(|source| io("read", old, source))?;
    for entry in entries.flatten() {
        let (from, to) = (entry.path(), dir.join(entry.file_name()));
        // An entry that cannot be brought back is left out (traced); callers check what they need.
        if let Err(e) = restore(&from, &to) {
            tracing::debug!("softrdma run: {} left out: {e}", to.display());
        }
    }
    Ok(())
}

/// `/sys/class` with `infiniband/<dev>/...` and `infiniband_verbs/softrdma<N>/ibdev` added.
fn rebuild_sys_class(old: &Path, devices: &[softrdma_verbs::device::DeviceInfo]) -> Result<(), DevNodeError> {
    let class = Path::new("/sys/class");
    cover(class, old)?;
    add_sysfs_trees(class, devices).inspect_err(|_| uncover(class))
}

/// Takes a cover off again (a rebuild that failed): the command then sees the real directory.
fn uncover(dir: &Path) {
    let _ = umount2(dir, MntFlags::MNT_DETACH);
}

fn add_sysfs_trees(class: &Path, devices: &[softrdma_verbs::device::DeviceInfo]) -> Result<(), DevNodeError> {
    for (i, dev) in devices.iter().enumerate() {
        let root = class.join("infiniband").join(&dev.name);
        for file in softrdma_verbs::device::sysfs_files(dev) {
            let Ok(text) = softrdma_verbs::device::sysfs_file(dev, &file) else {
                continue;
            };
            let path = root.join(&file);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|source| io("create", parent, source))?;
            }
            std::fs::write(&path, format!("{text}\n")).map_err(|source| io("write", &path, source))?;
        }
        let verbs = class.join("infiniband_verbs").join(format!("softrdma{i}"));
        std::fs::create_dir_all(&verbs).map_err(|source| io("create", &verbs, source))?;
        std::fs::write(verbs.join("ibdev"), format!("{}\n", dev.name)).map_err(|source| io("write", &verbs, source))?;
    }
    Ok(())
}

/// `/dev` as a tmpfs holding the entries of the original (reached through `old`) and the nodes.
fn rebuild_dev(old: &Path, count: usize) -> Result<(), DevNodeError> {
    let dev = Path::new("/dev");
    cover(dev, old)?;
    add_nodes(dev, old, count).inspect_err(|_| uncover(dev))
}

fn add_nodes(dev: &Path, old: &Path, count: usize) -> Result<(), DevNodeError> {
    if !is_char_device(&dev.join("null")) {
        return Err(io(
            "restore",
            &dev.join("null"),
            std::io::Error::other("not a character device after the rebuild"),
        ));
    }
    let ib = dev.join("infiniband");
    std::fs::create_dir_all(&ib).map_err(|source| io("create", &ib, source))?;
    for i in 0..count {
        let node = ib.join(format!("softrdma{i}"));
        File::create(&node).map_err(|source| io("create", &node, source))?;
        do_mount(
            Some(&old.join("null")),
            &node,
            None,
            MsFlags::MS_BIND,
            "/dev/null (bind)",
        )?;
    }
    Ok(())
}

/// Brings one entry of the original `/dev` back: symlinks as symlinks, the rest bind-mounted.
fn restore(from: &Path, to: &Path) -> Result<(), DevNodeError> {
    let meta = std::fs::symlink_metadata(from).map_err(|source| io("stat", from, source))?;
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(from).map_err(|source| io("readlink", from, source))?;
        return std::os::unix::fs::symlink(&target, to).map_err(|source| io("symlink", to, source));
    }
    if meta.is_dir() {
        std::fs::create_dir(to).map_err(|source| io("create", to, source))?;
    } else {
        File::create(to).map_err(|source| io("create", to, source))?;
    }
    do_mount(Some(from), to, None, MsFlags::MS_BIND | MsFlags::MS_REC, "(bind)")
}

fn do_mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    what: &str,
) -> Result<(), DevNodeError> {
    mount(source, target, fstype, flags, None::<&str>).map_err(|e| DevNodeError::Mount {
        what: match source {
            Some(s) if what.starts_with('(') => format!("{} {what}", s.display()),
            _ => what.to_owned(),
        },
        path: target.to_path_buf(),
        source: e,
    })
}

fn write(path: &str, text: &str) -> Result<(), DevNodeError> {
    std::fs::write(path, text).map_err(|source| io("write", Path::new(path), source))
}

fn io(what: &'static str, path: &Path, source: std::io::Error) -> DevNodeError {
    DevNodeError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

fn is_char_device(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_char_device())
}

/// How many nodes to make: two devices (siw, rxe) per interface, with room for interfaces that
/// come up while the command runs.
pub fn node_count() -> usize {
    let ifaces = std::fs::read_dir("/sys/class/net").map(|d| d.count()).unwrap_or(4);
    2 * ifaces + 8
}
