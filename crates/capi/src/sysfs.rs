//! `ibv_read_sysfs_file`: the historical helper that reads `DIR/FILE` into a buffer.
//!
//! Implemented with rdma-core's semantics (it is a plain file read): one `read` of at most
//! `size` bytes, a trailing newline replaced by NUL, otherwise NUL-terminated if there is room,
//! and a failure if the contents fill the buffer without room for the NUL.
//!
//! softrdma devices have no sysfs directory (their `ibdev_path`,
//! `/sys/class/infiniband/<name>`, does not exist). Reads below a device's `ibdev_path` are
//! answered from an emulated tree instead, with the kernel's formats (see [`emulated`]): the
//! node type and GUIDs, and port 1's state, link layer, GIDs with their `gid_attrs` (type and
//! netdev) and P_Keys. Any other file fails with ENOENT, which callers such as ibv_devinfo
//! (`board_id`) treat as "absent".

use std::ffi::{c_char, c_int, CStr, OsStr};
use std::io::Read as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;

use softrdma_verbs::device::{sysfs_file, DeviceInfo, SysfsMiss};

use crate::device::by_ibdev_path;
use crate::error::{non_null, ret_neg1, CError, CResult};

/// The contents of `file` (relative to the device directory) in the emulated sysfs tree of
/// `dev` (`softrdma_verbs::device::sysfs_file`), without the trailing newline; ENOENT for a
/// file the tree does not have, EINVAL for a `gid_attrs` file of an empty GID slot (as the
/// kernel).
pub(crate) fn emulated(dev: &DeviceInfo, file: &str) -> CResult<String> {
    sysfs_file(dev, file).map_err(|miss| match miss {
        SysfsMiss::NoFile { .. } => CError::new(libc::ENOENT, miss.to_string()),
        SysfsMiss::EmptyGid { .. } => CError::inval(miss.to_string()),
    })
}

/// Copies `text` plus a newline into `buf` as one `read` of a file with that content would,
/// with [`read_sysfs_file`]'s NUL handling; the number of bytes without the newline.
fn copy_emulated(text: &str, buf: &mut [u8]) -> CResult<c_int> {
    let content = format!("{text}\n");
    let limit = buf.len().min(c_int::MAX as usize);
    let n = content.len().min(limit);
    buf[..n].copy_from_slice(&content.as_bytes()[..n]);
    terminate(buf, n)
}

/// rdma-core's handling of `len` bytes read into `buf`: a trailing newline becomes NUL,
/// otherwise a NUL is appended if there is room; EOVERFLOW if there is none.
fn terminate(buf: &mut [u8], mut len: usize) -> CResult<c_int> {
    if len > 0 {
        if buf[len - 1] == b'\n' {
            len -= 1;
            buf[len] = 0;
        } else if len < buf.len() {
            buf[len] = 0;
        } else {
            return Err(CError::new(libc::EOVERFLOW, "contents do not fit with a NUL"));
        }
    }
    Ok(c_int::try_from(len).unwrap_or(c_int::MAX))
}

fn read_sysfs_file(dir: *const c_char, file: *const c_char, buf: *mut c_char, size: usize) -> CResult<c_int> {
    non_null(dir, "dir")?;
    non_null(file, "file")?;
    non_null(buf, "buf")?;
    // SAFETY: non-NULL C strings (C contract).
    let (dir, file) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
    let mut path = PathBuf::from(OsStr::from_bytes(dir.to_bytes()));
    path.push(OsStr::from_bytes(file.to_bytes()));
    // SAFETY: `buf` is writable for `size` bytes (C contract).
    let buf = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), size) };
    if let Some(dev) = by_ibdev_path(dir.to_bytes()) {
        let text = emulated(&dev.info(), &String::from_utf8_lossy(file.to_bytes()))?;
        return copy_emulated(&text, buf);
    }
    let limit = size.min(c_int::MAX as usize);
    let len = std::fs::File::open(&path)?.read(&mut buf[..limit])?;
    terminate(buf, len)
}

c_fn! {
    /// `const char *ibv_get_sysfs_path(void)`: where sysfs is mounted, as rdma-core answers
    /// (`$SYSFS_PATH` without trailing slashes, else `/sys`). A softrdma device's files under
    /// its `ibdev_path` are served by `ibv_read_sysfs_file`.
    fn ibv_get_sysfs_path() -> *const c_char {
        static PATH: std::sync::OnceLock<std::ffi::CString> = std::sync::OnceLock::new();
        PATH.get_or_init(|| {
            let env = std::env::var_os("SYSFS_PATH")
                .map(|p| p.as_bytes().to_vec())
                .map(|mut p| {
                    while p.len() > 1 && p.ends_with(b"/") {
                        p.pop();
                    }
                    p
                })
                .filter(|p| !p.is_empty());
            std::ffi::CString::new(env.unwrap_or_else(|| b"/sys".to_vec())).unwrap_or_else(|_| c"/sys".to_owned())
        })
        .as_ptr()
    }

    /// `int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)`:
    /// the number of bytes read (without a trailing newline), or -1 and errno.
    fn ibv_read_sysfs_file(dir: *const c_char, file: *const c_char, buf: *mut c_char, size: usize) -> c_int {
        ret_neg1(read_sysfs_file(dir, file, buf, size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(dir: &CStr, file: &CStr, size: usize) -> (c_int, Vec<u8>) {
        let mut buf = vec![0x55u8; size];
        // SAFETY: valid C strings and a buffer of `size` bytes.
        let n = unsafe { ibv_read_sysfs_file(dir.as_ptr(), file.as_ptr(), buf.as_mut_ptr().cast(), size) };
        (n, buf)
    }

    #[test]
    fn reads_strip_the_newline_and_terminate() {
        let dir = std::env::temp_dir().join(format!("softrdma-sysfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a"), "abc\n").unwrap();
        std::fs::write(dir.join("b"), "abcd").unwrap();
        let d = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        let (n, buf) = read(&d, c"a", 16);
        assert_eq!((n, &buf[..4]), (3, &b"abc\0"[..]));
        let (n, buf) = read(&d, c"b", 8);
        assert_eq!((n, &buf[..5]), (4, &b"abcd\0"[..]));
        assert_eq!(read(&d, c"b", 4).0, -1, "no room for the NUL");
        assert_eq!(read(&d, c"missing", 8).0, -1);
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::ENOENT));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn rxe_lo() -> DeviceInfo {
        use softrdma_verbs::device::{IfAddr, PortState, TransportKind};
        let addr = |ip: &str| IfAddr {
            ip: ip.parse().unwrap(),
            prefix_len: 8,
            scope_id: 0,
        };
        DeviceInfo {
            name: "rxe_lo".into(),
            transport: TransportKind::Roce,
            netdev: "lo".into(),
            ifindex: 1,
            loopback: true,
            addrs: vec![addr("127.0.0.1"), addr("::1")],
            mtu: 65536,
            mac: [0; 6],
            speed_mbps: None,
            port_state: PortState::Active,
            loopback_reason: None,
            is_loopback_netdev: true,
        }
    }

    #[test]
    fn emulated_tree_of_a_roce_device() {
        let d = rxe_lo();
        assert_eq!(emulated(&d, "ports/1/gid_attrs/types/0").unwrap(), "RoCE v2");
        assert_eq!(emulated(&d, "ports/1/gid_attrs/types/1").unwrap(), "RoCE v2");
        assert_eq!(emulated(&d, "ports/1/gid_attrs/ndevs/0").unwrap(), "lo");
        assert_eq!(
            emulated(&d, "ports/1/gids/0").unwrap(),
            "0000:0000:0000:0000:0000:ffff:7f00:0001"
        );
        assert_eq!(emulated(&d, "ports/1/link_layer").unwrap(), "Ethernet");
        assert_eq!(emulated(&d, "ports/1/state").unwrap(), "4: ACTIVE");
        assert_eq!(emulated(&d, "ports/1/phys_state").unwrap(), "5: LinkUp");
        assert_eq!(emulated(&d, "node_type").unwrap(), "1: CA");
        assert_eq!(emulated(&d, "ports/1/pkeys/0").unwrap(), "0xffff");
        let errno = |f: &str| emulated(&d, f).unwrap_err().errno();
        assert_eq!(errno("ports/1/gid_attrs/types/2"), libc::EINVAL, "an empty entry");
        assert_eq!(errno("ports/1/gid_attrs/types/16"), libc::ENOENT, "past gid_tbl_len");
        assert_eq!(errno("ports/1/gid_attrs/types/01"), libc::ENOENT);
        assert_eq!(errno("ports/1/pkeys/1"), libc::ENOENT);
        assert_eq!(errno("board_id"), libc::ENOENT);
        let mut bare = rxe_lo();
        bare.addrs.clear();
        assert_eq!(
            emulated(&bare, "ports/1/gid_attrs/types/0").unwrap_err().errno(),
            libc::EINVAL
        );
        assert_eq!(
            emulated(&bare, "ports/1/gids/0").unwrap(),
            "0000:0000:0000:0000:0000:0000:0000:0000"
        );
    }

    #[test]
    fn emulated_tree_of_an_iwarp_device() {
        let mut d = rxe_lo();
        d.name = "siw_lo".into();
        d.transport = softrdma_verbs::device::TransportKind::Iwarp;
        assert_eq!(emulated(&d, "node_type").unwrap(), "4: RNIC");
        assert_eq!(emulated(&d, "ports/1/gid_attrs/types/0").unwrap(), "IB/RoCE v1");
        assert_eq!(emulated(&d, "ports/1/link_layer").unwrap(), "Ethernet");
        assert_eq!(emulated(&d, "ports/1/pkeys/0").unwrap_err().errno(), libc::ENOENT);
    }

    #[test]
    fn emulated_reads_keep_the_file_semantics() {
        let mut buf = [0x55u8; 16];
        assert_eq!(copy_emulated("RoCE v2", &mut buf).unwrap(), 7);
        assert_eq!(&buf[..8], b"RoCE v2\0");
        let mut small = [0x55u8; 4];
        assert_eq!(
            copy_emulated("RoCE v2", &mut small).unwrap_err().errno(),
            libc::EOVERFLOW
        );
    }
}
