//! `metalift-probe`: prints what the Metal device answers.

fn main() {}
