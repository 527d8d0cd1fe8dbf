//! Responder resources: the last IRD RDMA READ/atomic requests, kept so a duplicate request
//! (the requester retrying after lost responses) is answered again without executing twice.

use super::psn::Psn;
use std::collections::VecDeque;

/// What a remembered request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResourceKind {
    /// An RDMA READ of `len` bytes at `va` under `rkey` (replayed by reading memory again).
    Read { va: u64, rkey: u32, len: u32 },
    /// An atomic whose original value was `orig` (replayed from here, never re-executed).
    Atomic { orig: u64 },
}

/// One remembered request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resource {
    /// PSN of the request (and of its first response).
    pub first_psn: Psn,
    /// Response PSNs it uses.
    pub npkts: u32,
    /// MSN its responses carried.
    pub msn: u32,
    /// The request.
    pub kind: ResourceKind,
}

/// The ring of remembered requests.
#[derive(Debug)]
pub(crate) struct Resources {
    cap: usize,
    list: VecDeque<Resource>,
}

impl Resources {
    /// Remembers up to `cap` requests.
    pub(crate) fn new(cap: usize) -> Resources {
        Resources {
            cap,
            list: VecDeque::with_capacity(cap.min(64)),
        }
    }

    /// Remembers a request, forgetting the oldest one when full.
    pub(crate) fn push(&mut self, r: Resource) {
        if self.cap == 0 {
            return;
        }
        while self.list.len() >= self.cap {
            self.list.pop_front();
        }
        self.list.push_back(r);
    }

    /// The remembered request whose response PSNs include `psn` (newest first).
    pub(crate) fn find(&self, psn: Psn) -> Option<&Resource> {
        self.list.iter().rev().find(|r| psn.in_range(r.first_psn, r.npkts))
    }

    /// Forgets everything.
    pub(crate) fn clear(&mut self) {
        self.list.clear();
    }
}
