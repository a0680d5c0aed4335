//! `sqlx::migrate!` embeds `migrations/` into the library: rebuild it when a migration is added
//! or changed, not only when a Rust file is.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
