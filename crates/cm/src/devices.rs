//! The host's device list, re-read at most once a second (it is read on every bind, resolve
//! and listen, and reading it walks every interface).

use softrdma_verbs::device::{self, DeviceInfo};
use softrdma_verbs::Result;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(1);

/// The device list, at most [`TTL`] old.
pub fn cached() -> Result<Vec<DeviceInfo>> {
    static CACHE: Mutex<Option<(Instant, Vec<DeviceInfo>)>> = Mutex::new(None);
    let mut c = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((at, devs)) = c.as_ref() {
        if at.elapsed() < TTL {
            return Ok(devs.clone());
        }
    }
    let devs = device::list_devices()?;
    *c = Some((Instant::now(), devs.clone()));
    Ok(devs)
}
