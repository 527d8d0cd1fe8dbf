//! `ibv_read_sysfs_file`: the historical helper that reads `DIR/FILE` into a buffer.
//!
//! Implemented with rdma-core's semantics (it is a plain file read): one `read` of at most
//! `size` bytes, a trailing newline replaced by NUL, otherwise NUL-terminated if there is room,
//! and a failure if the contents fill the buffer without room for the NUL. softrdma devices
//! have no sysfs directory (their `ibdev_path` does not exist), so reads through a device path
//! fail with ENOENT, which callers such as ibv_devinfo (`board_id`) treat as "absent".

use std::ffi::{c_char, c_int, CStr, OsStr};
use std::io::Read as _;
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;

use crate::error::{non_null, ret_neg1, CError, CResult};

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
    let limit = size.min(c_int::MAX as usize);
    let mut len = std::fs::File::open(&path)?.read(&mut buf[..limit])?;
    if len > 0 {
        if buf[len - 1] == b'\n' {
            len -= 1;
            buf[len] = 0;
        } else if len < size {
            buf[len] = 0;
        } else {
            return Err(CError::new(libc::EOVERFLOW, "contents do not fit with a NUL"));
        }
    }
    Ok(c_int::try_from(len).unwrap_or(c_int::MAX))
}

c_fn! {
    /// `int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)`:
    /// the number of bytes read (without a trailing newline), or -1 and errno.
    #[symver = "IBVERBS_1.0"]
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
}
