//! The application's side of a [`PlainQp`], with the verbs calls the engine tests were written
//! against: [`AppQp`] posts slices of WRs as `Qp::post_send`/`post_recv` do (and refuses a
//! send beyond `max_send_wr`, as they do), [`AppMr`] reads and writes a registered region as
//! `Mr` does.

use softrdma_verbs::mr::MrInner;
use softrdma_verbs::qp_host::PlainQp;
use softrdma_verbs::*;
use std::sync::Arc;

/// A [`PlainQp`] as the application posts to it.
#[derive(Debug, Clone)]
pub(super) struct AppQp {
    host: Arc<PlainQp>,
    max_send_wr: u32,
}

impl AppQp {
    /// `host`, refusing sends once `max_send_wr` are outstanding.
    pub fn new(host: Arc<PlainQp>, max_send_wr: u32) -> AppQp {
        AppQp { host, max_send_wr }
    }

    /// The host the engine runs on.
    pub fn inner(&self) -> &Arc<PlainQp> {
        &self.host
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        self.host.qpn()
    }

    /// Current state.
    pub fn state(&self) -> QpState {
        self.host.state()
    }

    /// Posts send WRs in order; on error, the index of the refused one (those before it are
    /// posted).
    pub fn post_send(&self, wrs: &[SendWr]) -> std::result::Result<(), (usize, Error)> {
        for (i, wr) in wrs.iter().enumerate() {
            let outstanding = self.host.sends_outstanding();
            if outstanding >= self.max_send_wr {
                let msg = format!("send queue full ({outstanding} WRs outstanding)");
                return Err((i, Error::new(Errno::NoMem, msg)));
            }
            self.host.try_post_send(wr.clone()).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// Posts one send WR.
    pub fn post_send_one(&self, wr: SendWr) -> Result<()> {
        self.post_send(&[wr]).map_err(|(_, e)| e)
    }

    /// Posts receive WRs in order; on error, the index of the refused one.
    pub fn post_recv(&self, wrs: &[RecvWr]) -> std::result::Result<(), (usize, Error)> {
        for (i, wr) in wrs.iter().enumerate() {
            self.host.try_post_recv(wr.clone()).map_err(|e| (i, e))?;
        }
        Ok(())
    }

    /// Posts one receive WR of one SGE.
    pub fn post_recv_one(&self, wr_id: u64, sge: Sge) -> Result<()> {
        self.post_recv(&[RecvWr {
            wr_id,
            sg_list: vec![sge],
        }])
        .map_err(|(_, e)| e)
    }
}

/// A region registered on a [`PlainQp`], as the application uses it.
#[derive(Debug, Clone)]
pub(super) struct AppMr(pub Arc<MrInner>);

impl AppMr {
    /// An SGE covering `[offset, offset+len)`.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr() + offset as u64,
            length: len,
            lkey: self.0.lkey,
        }
    }

    /// The address of byte 0, as a peer names it.
    pub fn addr(&self) -> u64 {
        self.0.iova
    }

    /// The remote key.
    pub fn rkey(&self) -> u32 {
        self.0.rkey
    }

    /// Copies `data` in at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        if !self.0.region.write(offset, data) {
            let msg = format!("write of {} bytes at {offset} is out of bounds", data.len());
            return Err(Error::inval(msg));
        }
        Ok(())
    }

    /// A copy of the whole region.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.0.region.len()];
        assert!(self.0.region.read(0, &mut v), "a live region reads");
        v
    }
}
