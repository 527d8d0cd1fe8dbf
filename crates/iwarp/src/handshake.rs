//! The MPA connection setup (RFC 5044 §7.1, RFC 6581), sans-I/O.
//!
//! softrdma asks for MPA revision 2 with enhanced connection setup (IRD/ORD are exchanged). A
//! request whose private data does not fit beside the 4-byte IRD/ORD block (more than 508
//! bytes) is sent as revision 1, which has no IRD/ORD exchange and no peer-to-peer mode.
//! Markers are never used; a peer that asks for them is rejected.
//!
//! # Start-up rules: peer-to-peer mode, the RTR, and who may send first
//!
//! Chosen to work with Linux siw (`drivers/infiniband/sw/siw/siw_cm.c`) on either side, with
//! hardware that wants peer-to-peer mode (Chelsio iw_cxgb4, `peer2peer=1`), and with softrdma.
//!
//! * **Initiator, default: no peer-to-peer mode.** The Request carries IRD/ORD and no P or RTR
//!   bits, as Linux siw sends it (its `peer_to_peer` module parameter is off by default). No
//!   RTR is sent; the first FPDU is whatever the application posts, held until [`RTR_DELAY`]
//!   after the Reply arrived (or until the responder's first FPDU). This avoids a Linux siw
//!   responder race: `siw_accept` sends its Reply *before* it hands the socket to the QP's
//!   receive path, and bytes arriving in between are dropped by `siw_cm_llp_data_ready`
//!   (endpoint already in RDMA mode) and not read again until more data arrives — the
//!   connection hangs. Seen against a TCG guest: the window was about 2 ms, and a SEND
//!   perftest posted 0.5 ms after the Reply sat unread until the close.
//! * **Initiator, opt-in peer-to-peer** ([`MpaParams::p2p`]; the driver takes it from
//!   `SOFTRDMA_IWARP_P2P=1`, read in one place, `driver::p2p_from_env`): for responders that
//!   need an RTR before they send (iw_cxgb4 with `peer2peer=1` expects the P bit and an RTR type
//!   it supports, else it Terminates with "no matching RTR"). The Request offers both a
//!   zero-length RDMA WRITE and a zero-length RDMA READ as RTR (as siw's `rtr_type`); the
//!   initiator sends the one type the Reply names as its first FPDU. A Reply without the P bit
//!   or with no type offered is accepted as non-peer-to-peer (lenient; a zero-length SEND RTR,
//!   which would consume a posted receive, is refused). To make the siw race above unlikely,
//!   the driver sends the RTR [`RTR_DELAY`] after the Reply arrived. Residual risk: against a
//!   Linux siw responder, an RTR that still lands in siw's window is only read once the
//!   initiator sends something else; a program whose server sends first then waits.
//! * **Responder, peer-to-peer requested:** honoured, with one RTR type of those offered: a
//!   zero-length WRITE when offered (as siw's `siw_proc_mpareq`, no response needed), else a
//!   zero-length READ; a request with the P bit and no type gets WRITE (as siw). The
//!   responder then sends nothing until the initiator's first FPDU (the RTR) arrives.
//! * **Responder, no peer-to-peer:** it may send before the initiator's first FPDU. RFC 5044
//!   §7.1.2 has the responder wait for that FPDU; the rule exists for markers (the stream
//!   position of FPDU mode) and for initiators that hand the stream to hardware only after
//!   the Reply. Markers are never negotiated here, softrdma's initiator hands the bytes after
//!   the Reply straight to its engine, and Linux siw does not wait either (its accept moves
//!   the QP to RTS and the application may post at once) — while a Linux initiator never
//!   sends an RTR, so waiting deadlocks server-sends-first programs (ucmatose). One hazard
//!   remains: a Linux siw initiator reads the Reply's private data with 4 bytes to spare
//!   (`siw_recv_mpa_rr`) and fails the connection (EPROTO) if FPDU bytes already sit behind
//!   it. So the driver holds the responder's first FPDU until the initiator sent one, or
//!   until the Reply was acknowledged by the peer's TCP and [`FIRST_SEND_GRACE`] passed
//!   (`Engine::release_tx`), whichever comes first.

use softrdma_verbs::{bail, Error, Result};
use softrdma_wire::{IrdOrd, MpaFrame, MpaKind, MPA_MAX_PD_LEN};
use std::time::Duration;

/// Initiator: how long after the MPA Reply arrived the first FPDU (the RTR in peer-to-peer
/// mode) may leave, unless the responder sent one first (keeps it out of Linux siw's accept
/// window, see the module documentation).
pub const RTR_DELAY: Duration = Duration::from_millis(50);

/// Non-peer-to-peer responder: how long after the peer's TCP acknowledged the MPA Reply the
/// first FPDU may leave without an FPDU from the initiator (lets a Linux siw initiator read
/// the Reply alone, see the module documentation). 20 ms was too short against a TCG guest
/// under load: its siw work handler read the Reply of the tenth of ten concurrent connections
/// only after the first FPDU, 23 ms behind the Reply, had arrived (ucmatose -c 10, CONNECT_ERROR).
pub const FIRST_SEND_GRACE: Duration = Duration::from_millis(50);

/// The ready-to-receive message of MPA peer-to-peer mode (RFC 6581 §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rtr {
    /// A zero-length RDMA WRITE.
    Write,
    /// A zero-length RDMA READ (answered by a zero-length Read Response).
    Read,
}

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
    /// Initiator: request MPA peer-to-peer mode (an RTR before the responder sends).
    pub p2p: bool,
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
    /// Peer-to-peer mode and its RTR: the initiator sends it as its first FPDU.
    pub rtr: Option<Rtr>,
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
        peer_to_peer: p.p2p,
        zero_length_rtr: false,
        write_rtr: p.p2p,
        read_rtr: p.p2p,
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
            reply_rtr(ours, &e)?,
        ),
        None => (ours.ord.max(1), clamp14(ours.ird) as u32, None),
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

/// The RTR the initiator owes, from the Reply's IRD/ORD block.
fn reply_rtr(ours: &MpaParams, e: &IrdOrd) -> Result<Option<Rtr>> {
    if !ours.p2p {
        // Not requested: a P bit in the Reply is the responder's mistake; no RTR is sent.
        return Ok(None);
    }
    Ok(match (e.peer_to_peer, e.write_rtr, e.read_rtr) {
        (_, true, _) => Some(Rtr::Write),
        (_, false, true) => Some(Rtr::Read),
        (true, false, false) if e.zero_length_rtr => bail!(
            Proto,
            "the peer chose a zero-length SEND as peer-to-peer RTR; softrdma offered WRITE or READ"
        ),
        _ => {
            tracing::debug!("the MPA responder declined peer-to-peer mode: no RTR is sent");
            None
        }
    })
}

/// The RTR type a responder picks from a peer-to-peer request (as Linux siw: WRITE when
/// offered, else READ, and WRITE when none is named).
fn request_rtr(e: &IrdOrd) -> Option<Rtr> {
    if !e.peer_to_peer {
        return None;
    }
    Some(if !e.write_rtr && e.read_rtr {
        Rtr::Read
    } else {
        Rtr::Write
    })
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
    let rtr = req.enhanced.filter(|_| use_enhanced).and_then(|e| request_rtr(&e));
    let peer_ird = req.enhanced.map(|e| e.ird as u32);
    let ord = match peer_ird {
        Some(i) => p.ord.min(i).max(1),
        None => p.ord.max(1),
    };
    let ird = clamp14(p.ird) as u32;
    let enhanced = use_enhanced.then_some(IrdOrd {
        ird: ird as u16,
        ord: ord as u16,
        peer_to_peer: rtr.is_some(),
        zero_length_rtr: false,
        write_rtr: rtr == Some(Rtr::Write),
        read_rtr: rtr == Some(Rtr::Read),
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
            p2p: false,
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
        assert!(neg_r.crc);
        assert_eq!(neg_r.rtr, None);
        assert_eq!(neg_r.ord, 3); // min(3, initiator IRD 4)
        assert_eq!(neg_r.peer_private_data, b"hello");
        let (out, used) = parse_reply(&reply, &init).unwrap().unwrap();
        assert_eq!(used, reply.len());
        let ReplyOutcome::Accepted(neg_i) = out else {
            panic!("rejected")
        };
        assert!(neg_i.crc);
        assert_eq!(neg_i.rtr, None);
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

    #[test]
    fn default_request_has_no_peer_to_peer_bits() {
        let req = build_request(&params(b"x", 4, 4, false)).unwrap();
        let (frame, _) = parse_request(&req).unwrap().unwrap();
        let e = frame.enhanced.expect("MPA v2 enhanced");
        assert!(
            !e.peer_to_peer && !e.read_rtr && !e.write_rtr && !e.zero_length_rtr,
            "{e:?}"
        );
        // The raw IRD/ORD words carry only the 14-bit counts (no 0x8000/0x4000 bits).
        let pd = &req[20..24];
        assert_eq!(pd[0] & 0xc0, 0);
        assert_eq!(pd[2] & 0xc0, 0);
    }

    #[test]
    fn opt_in_peer_to_peer_offers_write_and_read_and_follows_the_reply() {
        let mut init = params(b"", 4, 4, false);
        init.p2p = true;
        let req = build_request(&init).unwrap();
        let (frame, _) = parse_request(&req).unwrap().unwrap();
        let e = frame.enhanced.unwrap();
        assert!(e.peer_to_peer && e.read_rtr && e.write_rtr && !e.zero_length_rtr);
        // softrdma as responder picks WRITE (as siw).
        let (reply, neg_r) = build_accept(&frame, &params(b"", 4, 4, false)).unwrap();
        assert_eq!(neg_r.rtr, Some(Rtr::Write));
        let ReplyOutcome::Accepted(neg_i) = parse_reply(&reply, &init).unwrap().unwrap().0 else {
            panic!("rejected")
        };
        assert_eq!(neg_i.rtr, Some(Rtr::Write));
        // A responder that names READ only (iw_cxgb4's default p2p_type) gets a READ RTR.
        let reply_rtr_of = |p2p: bool, write: bool, read: bool| {
            let frame = MpaFrame {
                kind: MpaKind::Reply,
                markers: false,
                crc: false,
                reject: false,
                revision: 2,
                enhanced: Some(IrdOrd {
                    ird: 4,
                    ord: 4,
                    peer_to_peer: p2p,
                    zero_length_rtr: false,
                    write_rtr: write,
                    read_rtr: read,
                }),
                private_data: Vec::new(),
            };
            let mut out = Vec::new();
            frame.emit(&mut out).unwrap();
            match parse_reply(&out, &init).unwrap().unwrap().0 {
                ReplyOutcome::Accepted(n) => n.rtr,
                ReplyOutcome::Rejected(_) => panic!("rejected"),
            }
        };
        assert_eq!(reply_rtr_of(true, false, true), Some(Rtr::Read));
        assert_eq!(reply_rtr_of(true, true, false), Some(Rtr::Write));
        // A responder that declines: no RTR, the connection goes on without peer-to-peer.
        assert_eq!(reply_rtr_of(false, false, false), None);
    }

    #[test]
    fn responder_honours_peer_to_peer_requests_with_one_rtr_type() {
        let req = |write: bool, read: bool, zero: bool| {
            let frame = MpaFrame {
                kind: MpaKind::Request,
                markers: false,
                crc: false,
                reject: false,
                revision: 2,
                enhanced: Some(IrdOrd {
                    ird: 4,
                    ord: 4,
                    peer_to_peer: true,
                    zero_length_rtr: zero,
                    write_rtr: write,
                    read_rtr: read,
                }),
                private_data: Vec::new(),
            };
            let (reply, neg) = build_accept(&frame, &params(b"", 4, 4, false)).unwrap();
            let (rep, _) = MpaFrame::parse(&reply).unwrap().unwrap();
            let e = rep.enhanced.unwrap();
            assert!(e.peer_to_peer);
            assert!(e.write_rtr != e.read_rtr, "exactly one RTR type: {e:?}");
            neg.rtr
        };
        // A READ-only request (what softrdma sent before, and iw_cxgb4's default).
        assert_eq!(req(false, true, false), Some(Rtr::Read));
        assert_eq!(req(true, true, false), Some(Rtr::Write));
        assert_eq!(req(true, false, false), Some(Rtr::Write));
        assert_eq!(req(false, false, true), Some(Rtr::Write));
        assert_eq!(req(false, false, false), Some(Rtr::Write));
    }
}
