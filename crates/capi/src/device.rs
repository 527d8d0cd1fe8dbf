//! The device list: `ibv_get_device_list`, `ibv_free_device_list`, `ibv_get_device_name`,
//! `ibv_get_device_guid`.
//!
//! Each device the verbs crate reports gets one [`SoftDevice`], allocated once and never
//! freed, so a `struct ibv_device *` stays valid for the whole process, as in rdma-core (apps
//! keep using devices after `ibv_free_device_list`, and contexts point at them). Every
//! `ibv_get_device_list` call re-reads the device list: a device seen before (same name and
//! transport) keeps its object and gets its attributes refreshed; a new one is appended.

use std::ffi::{c_char, c_int};
use std::ptr;
use std::sync::{Mutex, MutexGuard, PoisonError};

use softrdma_verbs::device::{list_devices, DeviceInfo, TransportKind};

use crate::abi::{
    _ibv_device_ops, ibv_device, IBV_NODE_CA, IBV_NODE_RNIC, IBV_SYSFS_NAME_MAX, IBV_SYSFS_PATH_MAX, IBV_TRANSPORT_IB,
    IBV_TRANSPORT_IWARP,
};
use crate::error::{non_null, ret_or, ret_ptr, write_out, CError, CResult};

/// One device: the C `struct ibv_device` (first field, so the pointer handed to C is also the
/// object's address) plus the latest snapshot of the device from the verbs crate.
#[repr(C)]
pub(crate) struct SoftDevice {
    ibv: ibv_device,
    /// Position in creation order: the device index (`ibv_get_device_index`).
    index: usize,
    transport: TransportKind,
    info: Mutex<DeviceInfo>,
}

/// Every device object ever created, in creation order.
static REGISTRY: Mutex<Vec<&'static SoftDevice>> = Mutex::new(Vec::new());

fn registry() -> MutexGuard<'static, Vec<&'static SoftDevice>> {
    REGISTRY.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The device registry and every device's info, locked by the thread that forks (from the
/// `pthread_atfork` prepare handler to the parent and child handlers, see `fork`): a child
/// inherits device objects that work (a device list taken before `fork` opens in the child),
/// so their locks must not be held by a thread the child does not have.
pub(crate) struct DeviceHold {
    _infos: Vec<MutexGuard<'static, DeviceInfo>>,
    _reg: MutexGuard<'static, Vec<&'static SoftDevice>>,
}

/// Takes the locks of [`DeviceHold`] (the registry first, as `current_devices` does).
pub(crate) fn hold_for_fork() -> DeviceHold {
    let reg = registry();
    let infos = reg
        .iter()
        .map(|d| d.info.lock().unwrap_or_else(PoisonError::into_inner))
        .collect();
    DeviceHold {
        _infos: infos,
        _reg: reg,
    }
}

/// `(node_type, transport_type)` of a transport, as the kernel reports them: an iWARP RNIC,
/// or (RoCE, like rxe) an InfiniBand CA.
fn node_and_transport(t: TransportKind) -> (c_int, c_int) {
    match t {
        TransportKind::Iwarp => (IBV_NODE_RNIC, IBV_TRANSPORT_IWARP),
        TransportKind::Roce => (IBV_NODE_CA, IBV_TRANSPORT_IB),
    }
}

/// Copies `s` into a fixed C char array, truncated so that a NUL always fits.
pub(crate) fn fill_c_chars(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, &b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = b as c_char;
    }
    dst[n..].fill(0);
}

impl SoftDevice {
    fn new(index: usize, info: DeviceInfo) -> SoftDevice {
        let (node_type, transport_type) = node_and_transport(info.transport);
        let mut ibv = ibv_device {
            _ops: _ibv_device_ops {
                _dummy1: None,
                _dummy2: None,
            },
            node_type,
            transport_type,
            name: [0; IBV_SYSFS_NAME_MAX],
            dev_name: [0; IBV_SYSFS_NAME_MAX],
            dev_path: [0; IBV_SYSFS_PATH_MAX],
            ibdev_path: [0; IBV_SYSFS_PATH_MAX],
        };
        // There is no uverbs character device and no sysfs entry; these paths do not exist,
        // so sysfs reads through them (ibv_devinfo's board_id) fail with ENOENT.
        fill_c_chars(&mut ibv.name, &info.name);
        fill_c_chars(&mut ibv.dev_name, &format!("softrdma{index}"));
        fill_c_chars(
            &mut ibv.dev_path,
            &format!("/sys/class/infiniband_verbs/softrdma{index}"),
        );
        fill_c_chars(&mut ibv.ibdev_path, &format!("/sys/class/infiniband/{}", info.name));
        SoftDevice {
            ibv,
            index,
            transport: info.transport,
            info: Mutex::new(info),
        }
    }

    /// The pointer handed to C.
    pub(crate) fn as_ptr(&'static self) -> *mut ibv_device {
        ptr::from_ref(&self.ibv).cast_mut()
    }

    /// The latest snapshot of this device.
    pub(crate) fn info(&self) -> DeviceInfo {
        self.info.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn name(&self) -> &[c_char] {
        &self.ibv.name
    }

    /// `ibdev_path` (`/sys/class/infiniband/<name>`) as bytes, without the NUL.
    fn ibdev_path(&self) -> impl Iterator<Item = u8> + '_ {
        self.ibv.ibdev_path.iter().take_while(|&&c| c != 0).map(|&c| c as u8)
    }
}

/// The device whose `ibdev_path` is `dir` (trailing slashes ignored), among the devices this
/// process has seen: the emulated sysfs answers for it.
pub(crate) fn by_ibdev_path(dir: &[u8]) -> Option<&'static SoftDevice> {
    let dir = match dir.iter().rposition(|&b| b != b'/') {
        Some(last) => &dir[..=last],
        None => return None,
    };
    registry()
        .iter()
        .copied()
        .find(|d| d.ibdev_path().eq(dir.iter().copied()))
}

/// The devices present now, in the verbs crate's order, creating objects for new ones.
pub(crate) fn current_devices() -> CResult<Vec<&'static SoftDevice>> {
    crate::fork::install();
    let infos = list_devices().map_err(|e| CError::from(e).loud())?;
    let mut reg = registry();
    let mut out = Vec::with_capacity(infos.len());
    for info in infos {
        let existing = reg.iter().copied().find(|d| {
            let name = d.name().iter().take_while(|&&c| c != 0).map(|&c| c as u8);
            d.transport == info.transport && name.eq(info.name.bytes())
        });
        let dev = match existing {
            Some(d) => {
                *d.info.lock().unwrap_or_else(PoisonError::into_inner) = info;
                d
            }
            None => {
                let d: &'static SoftDevice = Box::leak(Box::new(SoftDevice::new(reg.len(), info)));
                reg.push(d);
                d
            }
        };
        out.push(dev);
    }
    Ok(out)
}

/// A NULL-terminated array of `items` for C (`ibv_get_device_list`, `rdma_get_devices`),
/// freed with [`free_c_list`].
pub(crate) fn into_c_list<T>(mut items: Vec<*mut T>) -> *mut *mut T {
    items.push(ptr::null_mut());
    Box::into_raw(items.into_boxed_slice()).cast::<*mut T>()
}

/// Frees an array made by [`into_c_list`] (not what it points at); NULL is ignored.
///
/// # Safety
/// `list` is NULL or came from [`into_c_list`] and is not used after this call.
pub(crate) unsafe fn free_c_list<T>(list: *mut *mut T) {
    if list.is_null() {
        return;
    }
    let mut len = 0;
    // SAFETY: per the contract `list` is a live boxed slice whose last element is the NULL
    // terminator, so every index up to it is in bounds.
    while !unsafe { *list.add(len) }.is_null() {
        len += 1;
    }
    // SAFETY: the same allocation as into_c_list made: `len` elements plus the terminator.
    drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(list, len + 1)) });
}

/// The device object behind a `struct ibv_device *` that this library handed out.
pub(crate) fn lookup(device: *const ibv_device) -> CResult<&'static SoftDevice> {
    non_null(device, "device")?;
    registry()
        .iter()
        .copied()
        .find(|d| ptr::eq(&d.ibv, device))
        .ok_or_else(|| CError::inval("not a device of this library"))
}

c_fn! {
    /// `struct ibv_device **ibv_get_device_list(int *num_devices)`: a NULL-terminated array,
    /// allocated per call, freed with `ibv_free_device_list`.
    fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
        ret_ptr(current_devices().map(|devs| {
            let count = c_int::try_from(devs.len()).unwrap_or(c_int::MAX);
            // SAFETY: `num_devices` is NULL or points to an int (C contract).
            unsafe { write_out(num_devices, count) };
            into_c_list(devs.into_iter().map(SoftDevice::as_ptr).collect())
        }))
    }

    /// `void ibv_free_device_list(struct ibv_device **list)`: frees the array only; the
    /// devices stay valid.
    fn ibv_free_device_list(list: *mut *mut ibv_device) {
        // SAFETY: `list` came from ibv_get_device_list (C contract).
        unsafe { free_c_list(list) }
    }

    /// `const char *ibv_get_device_name(struct ibv_device *device)`.
    fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
        ret_or(lookup(device).map(|d| d.ibv.name.as_ptr()), ptr::null())
    }

    /// `int ibv_get_device_index(struct ibv_device *device)`: the device's index, stable for
    /// the process (a kernel device's ifindex-like number), or -1 with errno.
    fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
        ret_or(lookup(device).map(|d| c_int::try_from(d.index).unwrap_or(c_int::MAX)), -1)
    }

    /// `__be64 ibv_get_device_guid(struct ibv_device *device)`: the node GUID in network byte
    /// order; 0 (with errno) for an unknown device.
    fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
        ret_or(lookup(device).map(|d| d.info().node_guid().to_be()), 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn c_chars_are_truncated_and_terminated() {
        let mut buf = [7 as c_char; 4];
        fill_c_chars(&mut buf, "abcdef");
        assert_eq!(buf, [b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]);
        fill_c_chars(&mut buf, "x");
        assert_eq!(buf, [b'x' as c_char, 0, 0, 0]);
    }

    #[test]
    fn list_is_null_terminated_and_devices_are_stable() {
        let mut n: c_int = -1;
        // SAFETY: valid out-pointer; the list is freed below.
        let first = unsafe { ibv_get_device_list(&mut n) };
        assert!(!first.is_null());
        let n = usize::try_from(n).unwrap();
        // SAFETY: same call with a NULL count is allowed.
        let second = unsafe { ibv_get_device_list(ptr::null_mut()) };
        for i in 0..n {
            // SAFETY: both lists hold n devices plus the terminator.
            let (a, b) = unsafe { (*first.add(i), *second.add(i)) };
            assert_eq!(a, b, "the same device keeps its address");
            // SAFETY: a device of this library.
            let name = unsafe { CStr::from_ptr(ibv_get_device_name(a)) };
            assert!(!name.to_bytes().is_empty());
        }
        // SAFETY: index n is the terminator.
        assert!(unsafe { *first.add(n) }.is_null());
        // SAFETY: lists from ibv_get_device_list, freed once each.
        unsafe {
            ibv_free_device_list(first);
            ibv_free_device_list(second);
            ibv_free_device_list(ptr::null_mut());
        }
    }

    #[test]
    fn unknown_device_pointers_are_rejected() {
        let bogus = [0u8; 700];
        // SAFETY: the pointer is only compared, never dereferenced.
        let name = unsafe { ibv_get_device_name(bogus.as_ptr().cast_mut().cast()) };
        assert!(name.is_null());
        // SAFETY: NULL is rejected before any dereference.
        assert_eq!(unsafe { ibv_get_device_guid(ptr::null_mut()) }, 0);
    }
}
