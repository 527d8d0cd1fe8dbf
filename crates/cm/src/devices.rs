//! The host's device list, re-read at most once a second (it is read on every bind, resolve
//! and listen, and reading it walks every interface).

use softrdma_verbs::device::{self, DeviceInfo};
use softrdma_verbs::Result;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(1);

/// The device list, at most [`TTL`] old.
pub fn cached() -> Result<Vec<DeviceInfo>> {
    // One cache per fork generation (its lock may be held at a fork, see softrdma_verbs::fork).
    type Cache = Mutex<Option<(Instant, Vec<DeviceInfo>)>>;
    static CACHE: softrdma_verbs::fork::PerProcess<Cache> = softrdma_verbs::fork::PerProcess::new();
    let mut c = CACHE
        .get_or_init(|| Mutex::new(None))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some((at, devs)) = c.as_ref() {
        if at.elapsed() < TTL {
            return Ok(devs.clone());
        }
    }
    let devs = device::list_devices()?;
    *c = Some((Instant::now(), devs.clone()));
    Ok(devs)
}
