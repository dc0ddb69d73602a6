//! Our `FILE_DESCRIPTOR_SET` against the official Perfetto descriptors, and
//! the checker's report on a deliberately wrong schema.

use heapprofd_proto::perfetto;
use serde_json::Value;

use crate::script::{path_arg, run_script, str_list, write_temp};

#[test]
fn schema_matches_the_official_one() {
    let fds = write_temp(perfetto::FILE_DESCRIPTOR_SET);
    let run = run_script(&["--schema", &path_arg(&fds)]);
    let j = &run.json;
    assert_eq!(j["mismatches"], Value::Array(vec![]), "{j:#}");
    assert_eq!(j["ok"], true, "{j:#}\n{}", run.stderr);
    assert_eq!(run.code, 0);
    assert_eq!(
        str_list(&j["allowed_deviations"]),
        ["perfetto.protos.ModuleSymbols.build_id: TYPE_BYTES here, TYPE_STRING upstream"]
    );
    // Every message of every file was compared.
    assert!(j["fields_checked"].as_u64().unwrap() >= 130, "{j:#}");
    assert!(j["messages_checked"].as_u64().unwrap() >= 25, "{j:#}");
    assert_eq!(j["files"].as_array().unwrap().len(), 11, "{j:#}");
}

/// Hand-rolled descriptor messages (google/protobuf/descriptor.proto field
/// numbers) to build a deliberately wrong schema.
mod descriptor {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FileDescriptorSet {
        #[prost(message, repeated, tag = "1")]
        pub file: Vec<FileDescriptorProto>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FileDescriptorProto {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        #[prost(string, optional, tag = "2")]
        pub package: Option<String>,
        #[prost(message, repeated, tag = "4")]
        pub message_type: Vec<DescriptorProto>,
        #[prost(string, optional, tag = "12")]
        pub syntax: Option<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct DescriptorProto {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        #[prost(message, repeated, tag = "2")]
        pub field: Vec<FieldDescriptorProto>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FieldDescriptorProto {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        #[prost(int32, optional, tag = "3")]
        pub number: Option<i32>,
        #[prost(int32, optional, tag = "4")]
        pub label: Option<i32>,
        #[prost(int32, optional, tag = "5")]
        pub r#type: Option<i32>,
    }
    pub const LABEL_OPTIONAL: i32 = 1;
    pub const LABEL_REPEATED: i32 = 3;
    pub const TYPE_INT64: i32 = 3;
    pub const TYPE_UINT64: i32 = 4;
}

#[test]
fn schema_check_reports_mismatches() {
    use descriptor::*;
    use prost::Message;
    let field = |name: &str, number: i32, label: i32, ty: i32| FieldDescriptorProto {
        name: Some(name.to_owned()),
        number: Some(number),
        label: Some(label),
        r#type: Some(ty),
    };
    let bad = FileDescriptorSet {
        file: vec![FileDescriptorProto {
            name: Some("bad.proto".to_owned()),
            package: Some("perfetto.protos".to_owned()),
            syntax: Some("proto2".to_owned()),
            message_type: vec![
                DescriptorProto {
                    name: Some("Mapping".to_owned()),
                    field: vec![
                        field("iid", 1, LABEL_OPTIONAL, TYPE_UINT64),  // correct
                        field("start", 4, LABEL_OPTIONAL, TYPE_INT64), // wrong type
                        field("end", 6, LABEL_OPTIONAL, TYPE_UINT64),  // wrong number
                        field("path_string_ids", 7, LABEL_OPTIONAL, TYPE_UINT64), // not repeated
                        field("made_up", 99, LABEL_REPEATED, TYPE_UINT64), // no such field
                    ],
                },
                DescriptorProto {
                    name: Some("NoSuchMessage".to_owned()),
                    field: vec![],
                },
            ],
        }],
    };
    let fds = write_temp(&bad.encode_to_vec());
    let run = run_script(&["--schema", &path_arg(&fds)]);
    let j = &run.json;
    assert_eq!(run.code, 1, "{j:#}");
    assert_eq!(j["ok"], false);
    let mismatches = str_list(&j["mismatches"]);
    for expected in [
        "perfetto.protos.Mapping.start: type TYPE_INT64, official TYPE_UINT64",
        "perfetto.protos.Mapping.end = 6: named load_bias upstream",
        "perfetto.protos.Mapping.path_string_ids: optional, official repeated",
        "perfetto.protos.Mapping.made_up = 99: no field with this number upstream",
        "message perfetto.protos.NoSuchMessage: not in the official schema",
    ] {
        assert!(
            mismatches.iter().any(|m| m == expected),
            "missing {expected:?} in {mismatches:#?}"
        );
    }
    assert_eq!(mismatches.len(), 5, "{mismatches:#?}");
}
