//! `seckill-openapi [PATH]`: writes the OpenAPI document generated from the handlers to PATH
//! (`make openapi` writes `docs/openapi.json`), or prints it.

fn main() -> anyhow::Result<()> {
    let json = seckill_devserver::openapi::render();
    match std::env::args_os().nth(1) {
        Some(path) => std::fs::write(&path, json)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.to_string_lossy()))?,
        None => print!("{json}"),
    }
    Ok(())
}
