//! Connection parameters (`struct rdma_conn_param`).

/// What a side asks for when connecting or accepting, and what events report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data (iWARP: at most [`crate::MAX_PRIVATE_DATA`] bytes).
    pub private_data: Vec<u8>,
    /// Incoming RDMA READs accepted at once (IRD); 0xFF = the device maximum.
    pub responder_resources: u8,
    /// Outgoing RDMA READs at once (ORD); 0xFF = the device maximum.
    pub initiator_depth: u8,
    /// Exchanged, unused.
    pub flow_control: u8,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// RNR retries (3 bits).
    pub rnr_retry_count: u8,
    /// The QP uses an SRQ (ignored when the id has a QP).
    pub srq: bool,
    /// QP number (ignored when the id has a QP).
    pub qp_num: u32,
}

/// What a UD (RDMA_PS_UDP) event says about the peer (`struct rdma_ud_param`; its private
/// data is the event's [`ConnParam::private_data`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UdParam {
    /// The peer's UD QP number (ESTABLISHED); 0 in a CONNECT_REQUEST.
    pub qp_num: u32,
    /// The Q_Key to send to the peer with (ESTABLISHED); 0 in a CONNECT_REQUEST.
    pub qkey: u32,
    /// Address vector to the peer (`ibv_create_ah`); zero in a CONNECT_REQUEST.
    pub ah_attr: softrdma_verbs::AhAttr,
}
