//! Compiles `proto/` with protox (no protoc needed), then generates the prost
//! messages, the tonic services, the proto3-JSON (pbjson) impls, and the
//! descriptor set that server reflection serves.

use std::{env, path::PathBuf};

use prost::Message as _;

const PROTOS: &[&str] = &[
    "proto/spillway/v1/common.proto",
    "proto/spillway/v1/sessions.proto",
    "proto/spillway/v1/payloads.proto",
    "proto/spillway/v1/context.proto",
    "proto/spillway/v1/codemode.proto",
    "proto/spillway/v1/audit.proto",
    "proto/spillway/v1/policies.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    let descriptor_path = out_dir.join("spillway_descriptor.bin");

    let fds = protox::compile(PROTOS, ["proto"])?;
    std::fs::write(&descriptor_path, fds.encode_to_vec())?;

    tonic_prost_build::configure()
        .bytes(".spillway.v1.UploadChunk.data")
        .bytes(".spillway.v1.DataChunk.data")
        .bytes(".spillway.v1.ToolResult.content")
        .bytes(".spillway.v1.ExecRequest.module")
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_fds(fds)?;

    // The contract names a service `Context`; tonic's generated server code
    // also says `Context<'_>` meaning `std::task::Context`, which the service
    // trait would shadow. Spell that one out.
    let generated = out_dir.join("spillway.v1.rs");
    let code = std::fs::read_to_string(&generated)?;
    std::fs::write(
        &generated,
        code.replace("_cx: &mut Context<'_>", "_cx: &mut std::task::Context<'_>"),
    )?;

    let descriptors = std::fs::read(&descriptor_path)?;
    pbjson_build::Builder::new()
        .register_descriptors(&descriptors)?
        .build(&[".spillway"])?;
    Ok(())
}
