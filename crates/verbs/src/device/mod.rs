//! Devices: one per UP interface with an address, or exactly the ones `SOFTRDMA_CONFIG` names.
