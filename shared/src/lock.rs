//! The per-activity admin lock and its fencing token (issue 4 fills this in).
