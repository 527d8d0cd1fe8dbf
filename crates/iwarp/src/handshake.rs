//! The MPA connection setup (RFC 5044 §7.1, RFC 6581), sans-I/O.
//!
//! softrdma asks for MPA revision 2 with enhanced connection setup: IRD/ORD are exchanged, and
//! peer-to-peer mode with a zero-length RDMA READ as the ready-to-receive (RTR) message lets
//! either side send first. A request whose private data does not fit beside the 4-byte IRD/ORD
//! block (more than 508 bytes) is sent as revision 1, which has no IRD/ORD exchange.
//! Markers are never used; a peer that asks for them is rejected.

use softrdma_verbs::{bail, Error, Result};
use softrdma_wire::{IrdOrd, MpaFrame, MpaKind, MPA_MAX_PD_LEN};

/// Largest private data the transport carries (RFC 5044 PD_Length limit).
pub const MAX_PRIVATE_DATA: usize = MPA_MAX_PD_LEN;

/// One side's connection parameters.
#[derive(Debug, Clone, Default)]
pub struct MpaParams {
    /// Private data for the peer (at most 512 bytes).
    pub private_data: Vec<u8>,
    /// RDMA READs this side accepts at once as responder (IRD).
    pub ird: u32,
    /// RDMA READs this side issues at once as requester (ORD).
    pub ord: u32,
    /// Ask for FPDU CRC32c.
    pub crc: bool,
}

/// What the handshake settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// CRC32c on every FPDU.
    pub crc: bool,
    /// Incoming READs this side accepts (≥ 1).
    pub ird: u32,
    /// Outgoing READs this side may have outstanding (≥ 1).
    pub ord: u32,
    /// Peer-to-peer mode: the initiator sends a zero-length READ as its first FPDU.
    pub rtr: bool,
    /// The peer's private data.
    pub peer_private_data: Vec<u8>,
    /// The MPA revision in use.
    pub revision: u8,
}

/// The reply to a request, as the initiator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyOutcome {
    /// Accepted: the connection is up.
    Accepted(Negotiated),
    /// Rejected, with the peer's private data.
    Rejected(Vec<u8>),
}

fn clamp14(v: u32) -> u16 {
    v.clamp(1, 0x3fff) as u16
}

/// Checks the private data size (EINVAL with a clear message).
pub fn check_private_data(pd: &[u8]) -> Result<()> {
    if pd.len() > MAX_PRIVATE_DATA {
        bail!(
            Inval,
            "private data of {} bytes exceeds the MPA limit of {MAX_PRIVATE_DATA} bytes",
            pd.len()
        );
    }
    Ok(())
}

fn enhanced_fits(pd: &[u8]) -> bool {
    pd.len() + 4 <= MPA_MAX_PD_LEN
}

/// Builds the initiator's MPA Request.
pub fn build_request(p: &MpaParams) -> Result<Vec<u8>> {
    check_private_data(&p.private_data)?;
    let enhanced = enhanced_fits(&p.private_data).then(|| IrdOrd {
        ird: clamp14(p.ird),
        ord: clamp14(p.ord),
        peer_to_peer: true,
        zero_length_rtr: false,
        write_rtr: false,
        read_rtr: true,
    });
    let frame = MpaFrame {
        kind: MpaKind::Request,
        markers: false,
        crc: p.crc,
        reject: false,
        revision: if enhanced.is_some() { 2 } else { 1 },
        enhanced,
        private_data: p.private_data.clone(),
    };
    let mut out = Vec::with_capacity(frame.wire_len());
    frame
        .emit(&mut out)
        .map_err(|e| Error::inval(format!("MPA request: {e}")))?;
    Ok(out)
}

/// Parses the MPA Reply on the initiator. `Ok(None)`: more bytes needed.
pub fn parse_reply(buf: &[u8], ours: &MpaParams) -> Result<Option<(ReplyOutcome, usize)>> {
    let Some((frame, used)) =
        MpaFrame::parse(buf).map_err(|e| Error::new(softrdma_verbs::Errno::Proto, format!("MPA reply: {e}")))?
    else {
        return Ok(None);
    };
    if frame.kind != MpaKind::Reply {
        bail!(Proto, "MPA reply expected, got an MPA request");
    }
    if frame.reject {
        return Ok(Some((ReplyOutcome::Rejected(frame.private_data), used)));
    }
    if frame.markers {
        bail!(
            Proto,
            "the peer asked for MPA markers, which softrdma does not implement"
        );
    }
    let (ord, ird, rtr) = match frame.enhanced {
        Some(e) => (
            ours.ord.min(e.ird as u32).max(1),
            clamp14(ours.ird) as u32,
            e.peer_to_peer && e.read_rtr,
        ),
        None => (ours.ord.max(1), clamp14(ours.ird) as u32, false),
    };
    Ok(Some((
        ReplyOutcome::Accepted(Negotiated {
            crc: frame.crc || ours.crc,
            ird,
            ord,
            rtr,
            peer_private_data: frame.private_data,
            revision: frame.revision,
        }),
        used,
    )))
}

/// Parses the MPA Request on the responder. `Ok(None)`: more bytes needed.
pub fn parse_request(buf: &[u8]) -> Result<Option<(MpaFrame, usize)>> {
    let Some((frame, used)) =
        MpaFrame::parse(buf).map_err(|e| Error::new(softrdma_verbs::Errno::Proto, format!("MPA request: {e}")))?
    else {
        return Ok(None);
    };
    if frame.kind != MpaKind::Request {
        bail!(Proto, "MPA request expected, got an MPA reply");
    }
    Ok(Some((frame, used)))
}

/// Builds the responder's accepting MPA Reply and the negotiated result.
pub fn build_accept(req: &MpaFrame, p: &MpaParams) -> Result<(Vec<u8>, Negotiated)> {
    check_private_data(&p.private_data)?;
    if req.markers {
        bail!(
            Proto,
            "the peer asked for MPA markers, which softrdma does not implement"
        );
    }
    let crc = req.crc || p.crc;
    let use_enhanced = req.enhanced.is_some() && enhanced_fits(&p.private_data);
    let rtr = use_enhanced && req.enhanced.is_some_and(|e| e.peer_to_peer && e.read_rtr);
    let peer_ird = req.enhanced.map(|e| e.ird as u32);
    let ord = match peer_ird {
        Some(i) => p.ord.min(i).max(1),
        None => p.ord.max(1),
    };
    let ird = clamp14(p.ird) as u32;
    let enhanced = use_enhanced.then_some(IrdOrd {
        ird: ird as u16,
        ord: ord as u16,
        peer_to_peer: rtr,
        zero_length_rtr: false,
        write_rtr: false,
        read_rtr: rtr,
    });
    let frame = MpaFrame {
        kind: MpaKind::Reply,
        markers: false,
        crc,
        reject: false,
        revision: if use_enhanced { 2 } else { 1 },
        enhanced,
        private_data: p.private_data.clone(),
    };
    let mut out = Vec::with_capacity(frame.wire_len());
    frame
        .emit(&mut out)
        .map_err(|e| Error::inval(format!("MPA reply: {e}")))?;
    Ok((
        out,
        Negotiated {
            crc,
            ird,
            ord,
            rtr,
            peer_private_data: req.private_data.clone(),
            revision: frame.revision,
        },
    ))
}

/// Builds a rejecting MPA Reply carrying `private_data`.
pub fn build_reject(req_revision: u8, private_data: &[u8]) -> Result<Vec<u8>> {
    check_private_data(private_data)?;
    let frame = MpaFrame {
        kind: MpaKind::Reply,
        markers: false,
        crc: false,
        reject: true,
        revision: if req_revision >= 2 { 2 } else { 1 },
        enhanced: None,
        private_data: private_data.to_vec(),
    };
    let mut out = Vec::with_capacity(frame.wire_len());
    frame
        .emit(&mut out)
        .map_err(|e| Error::inval(format!("MPA reject: {e}")))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pd: &[u8], ird: u32, ord: u32, crc: bool) -> MpaParams {
        MpaParams {
            private_data: pd.to_vec(),
            ird,
            ord,
            crc,
        }
    }

    #[test]
    fn enhanced_negotiation_round_trip() {
        let init = params(b"hello", 4, 8, false);
        let req = build_request(&init).unwrap();
        let (frame, used) = parse_request(&req).unwrap().unwrap();
        assert_eq!(used, req.len());
        assert_eq!(frame.revision, 2);
        let resp = params(b"world", 2, 3, true);
        let (reply, neg_r) = build_accept(&frame, &resp).unwrap();
        assert!(neg_r.crc && neg_r.rtr);
        assert_eq!(neg_r.ord, 3); // min(3, initiator IRD 4)
        assert_eq!(neg_r.peer_private_data, b"hello");
        let (out, used) = parse_reply(&reply, &init).unwrap().unwrap();
        assert_eq!(used, reply.len());
        let ReplyOutcome::Accepted(neg_i) = out else {
            panic!("rejected")
        };
        assert!(neg_i.crc && neg_i.rtr);
        assert_eq!(neg_i.ord, 2); // min(8, responder IRD 2)
        assert_eq!(neg_i.peer_private_data, b"world");
    }

    #[test]
    fn large_private_data_uses_revision_1_and_limit_is_512() {
        let init = params(&[7u8; 512], 1, 1, false);
        let req = build_request(&init).unwrap();
        let (frame, _) = parse_request(&req).unwrap().unwrap();
        assert_eq!(frame.revision, 1);
        assert_eq!(frame.private_data.len(), 512);
        let err = build_request(&params(&[0u8; 513], 1, 1, false)).unwrap_err();
        assert_eq!(err.errno, softrdma_verbs::Errno::Inval);
        assert!(err.msg.contains("513"), "{}", err.msg);
    }

    #[test]
    fn reject_carries_private_data() {
        let init = params(b"", 1, 1, false);
        let rej = build_reject(2, b"go away").unwrap();
        let (out, _) = parse_reply(&rej, &init).unwrap().unwrap();
        assert_eq!(out, ReplyOutcome::Rejected(b"go away".to_vec()));
    }

    #[test]
    fn partial_input_needs_more() {
        let req = build_request(&params(b"abc", 1, 1, false)).unwrap();
        for cut in 0..req.len() {
            assert!(parse_request(&req[..cut]).unwrap().is_none());
        }
    }
}
