//! Messages and notifications the backend sends on a client's request: budgets keyed by
//! who receives them.
//!
//! OTPs by SMS or e-mail, invitations and push notifications are limited per recipient and
//! destination, not only per sender, so SMS pumping and notification floods meet a limit
//! however many accounts, devices and addresses they come from.

pub mod conversion;
pub mod events;
mod recipient;

pub use events::{DeliveryBatch, Messaging};
pub use recipient::{InvalidRecipient, Kind, Recipient, Recipients};
