//! Counters for tests, tools and the driver's statistics.

use softrdma_wire::roce::{AethKind, NakCode};

/// NAKs by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NakCounts {
    /// PSN sequence error NAKs.
    pub psn_sequence: u64,
    /// Receiver-not-ready NAKs.
    pub rnr: u64,
    /// Remote access error NAKs.
    pub remote_access: u64,
    /// Invalid request NAKs (including invalid RD request).
    pub invalid_request: u64,
    /// Remote operational error NAKs.
    pub remote_operational: u64,
}

impl NakCounts {
    /// Counts one NAK of `code`.
    pub(crate) fn count(&mut self, code: NakCode) {
        match code {
            NakCode::PsnSequenceError => self.psn_sequence += 1,
            NakCode::InvalidRequest | NakCode::InvalidRdRequest => self.invalid_request += 1,
            NakCode::RemoteAccessError => self.remote_access += 1,
            NakCode::RemoteOperationalError => self.remote_operational += 1,
        }
    }

    /// Counts one AETH if it is a NAK of any kind.
    pub(crate) fn count_aeth(&mut self, kind: AethKind) {
        match kind {
            AethKind::Nak(code) => self.count(code),
            AethKind::RnrNak { .. } => self.rnr += 1,
            AethKind::Ack { .. } | AethKind::Reserved(_) => {}
        }
    }

    /// All NAKs.
    pub fn total(&self) -> u64 {
        self.psn_sequence + self.rnr + self.remote_access + self.invalid_request + self.remote_operational
    }
}

/// Counters of one RC engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RcStats {
    /// Packets produced by `poll_transmit` (requests and responses, first sends and resends).
    pub tx_packets: u64,
    /// Packets handed to `handle_packet`.
    pub rx_packets: u64,
    /// Request packets sent again (go-back-N after a NAK, a timeout, an RNR wait or an implied NAK).
    pub retransmitted_packets: u64,
    /// ACK timeouts that fired.
    pub timeouts: u64,
    /// Implied NAKs: a response showed that READ or atomic responses were lost.
    pub implied_naks: u64,
    /// NAKs this side sent as responder.
    pub naks_sent: NakCounts,
    /// NAKs this side received as requester.
    pub naks_received: NakCounts,
    /// Duplicate requests received (PSN behind the expected one); answered, not executed again.
    pub duplicates: u64,
    /// Responses for PSNs already acknowledged (late, duplicated or replayed); ignored.
    pub stale_responses: u64,
    /// Requests ahead of the expected PSN, dropped.
    pub out_of_sequence_dropped: u64,
    /// Plain ACKs sent (not counting READ responses and atomic ACKs).
    pub acks_sent: u64,
    /// ACK packets received (positive ACKs, not counting READ responses and atomic ACKs).
    pub acks_received: u64,
    /// RNR waits started (one per RNR NAK acted on).
    pub rnr_waits: u64,
    /// READ response packets sent (first transmissions and replays).
    pub read_responses_sent: u64,
    /// Atomic operations executed on local memory (replays not counted).
    pub atomics_executed: u64,
    /// Packets dropped as invalid without a reply: wrong P_Key or QP, headers that do not
    /// match the opcode, inconsistent padding, malformed responses.
    pub dropped_invalid: u64,
    /// Keepalive probes sent by the idle QP (first probes and resends).
    pub keepalive_probes: u64,
}

/// Counters of one UD engine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdStats {
    /// Datagrams sent.
    pub tx_packets: u64,
    /// Datagrams handed to `handle_packet`.
    pub rx_packets: u64,
    /// Datagrams delivered into a receive buffer.
    pub rx_delivered: u64,
    /// Dropped: the Q_Key did not match.
    pub rx_dropped_qkey: u64,
    /// Dropped: no receive WR was posted.
    pub rx_dropped_no_recv: u64,
    /// Dropped: not a UD SEND, wrong P_Key or QP, headers that do not match the opcode.
    pub rx_dropped_invalid: u64,
    /// Receives completed with LOC_LEN_ERR (datagram + GRH larger than the buffer).
    pub rx_length_errors: u64,
    /// Send WRs completed with an error (too long, bad lkey, bad opcode).
    pub tx_errors: u64,
}
