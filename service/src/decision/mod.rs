//! The decision core every front shares: a check validated and bounded (`check`), the
//! settlements of what admitted requests used (`settle`), and the slots granted lately watched
//! for their renewals (`slot_watch`).

pub mod check;
pub mod settle;
pub mod slot_watch;
