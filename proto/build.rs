//! Compiles the .proto files with protox (pure Rust), so no system protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/kairos/v1/kairos.proto", "proto/kairos/v1/peer.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
