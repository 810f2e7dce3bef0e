use proptest::prelude::*;

use super::*;

fn stored(blocks: Vec<u64>, parent: Option<u64>, medium: Medium) -> KvEvent {
    let n = blocks.len() as u32;
    KvEvent::Stored {
        blocks,
        parent,
        token_ids: (0..n * 4).collect(),
        block_size: 4,
        lora_id: None,
        medium,
    }
}

#[test]
fn a_batch_reads_back_as_it_was_written() {
    let batch = KvEventBatch {
        ts: 1_765_000_000.25,
        events: vec![
            stored(vec![1, u64::MAX, 1 << 40], None, Medium::Gpu),
            stored(vec![7], Some(1 << 40), Medium::Offloaded),
            KvEvent::Removed {
                blocks: vec![u64::MAX],
                medium: Medium::Gpu,
            },
            KvEvent::Cleared,
        ],
        data_parallel_rank: Some(0),
    };
    assert_eq!(decode_batch(&encode_batch(&batch)), Ok(batch));
}

/// What vLLM 0.32's own classes and msgspec encoder write (`tools/vllm/kv_events_fixture.py`).
fn vllm_fixture_events(h: impl Fn(u8) -> u64) -> KvEventBatch {
    KvEventBatch {
        ts: 1_765_000_000.5,
        events: vec![
            KvEvent::Stored {
                blocks: vec![h(1), h(2)],
                parent: None,
                token_ids: (0..8).collect(),
                block_size: 4,
                lora_id: None,
                medium: Medium::Gpu,
            },
            KvEvent::Stored {
                blocks: vec![h(3)],
                parent: Some(h(2)),
                token_ids: vec![8, 9, 10, 11],
                block_size: 4,
                lora_id: Some(7),
                medium: Medium::Offloaded,
            },
            KvEvent::Removed {
                blocks: vec![h(1)],
                medium: Medium::Gpu,
            },
            KvEvent::Cleared,
        ],
        data_parallel_rank: Some(0),
    }
}

#[test]
fn vllm_0_32_batches_read_with_bytes_and_with_integer_hashes() {
    let bytes = include_bytes!("vllm-0.32-bytes.msgpack");
    assert_eq!(
        decode_batch(bytes),
        Ok(vllm_fixture_events(|i| xxh3_64(&[i; 32])))
    );
    let ints = include_bytes!("vllm-0.32-int.msgpack");
    assert_eq!(
        decode_batch(ints),
        Ok(vllm_fixture_events(|i| (1u64 << 63) + u64::from(i)))
    );
}

/// podsim writes what vLLM 0.32 writes, field for field (the fixture's one difference: its
/// second event names a LoRA, which podsim's events never do).
#[test]
fn podsim_writes_vllm_0_32_bytes() {
    let ints = include_bytes!("vllm-0.32-int.msgpack");
    let ours = encode_batch(&vllm_fixture_events(|i| (1u64 << 63) + u64::from(i)));
    let named = b"\xa9lora_name\xa8tenant-a";
    let at = ints.windows(named.len()).position(|w| w == named).unwrap();
    let mut expected = ints.to_vec();
    expected.splice(at + 10..at + named.len(), [0xc0]);
    assert_eq!(ours, expected);
}

/// Shapes of earlier vLLM releases and of msgspec that podsim never writes: events as tagged
/// arrays, signed (negative) integer hashes, bytes hashes, a float32 timestamp, a map and fields
/// this reader does not know, an unknown tag.
#[test]
fn earlier_vllm_array_events_and_unknown_fields_are_read() {
    let mut p = vec![0x93, 0xca];
    p.extend_from_slice(&1.5f32.to_bits().to_be_bytes());
    p.push(0x93); // three events
                  // ["BlockStored", [-2, b"\x01\x02"], nil, [1, 2], 1, 7, "GPU", {1: 2}, "extra"]
    p.extend_from_slice(&[0x99, 0xab]);
    p.extend_from_slice(b"BlockStored");
    p.extend_from_slice(&[
        0x92, 0xfe, 0xc4, 0x02, 0x01, 0x02, 0xc0, 0x92, 0x01, 0x02, 0x01, 0x07,
    ]);
    p.extend_from_slice(&[0xa3, b'G', b'P', b'U', 0x81, 0x01, 0x02, 0xa5]);
    p.extend_from_slice(b"extra");
    // ["Novel", 1]
    p.extend_from_slice(&[0x92, 0xa5]);
    p.extend_from_slice(b"Novel");
    p.push(0x01);
    // ["BlockRemoved", [-2], "CPU"]
    p.extend_from_slice(&[0x93, 0xac]);
    p.extend_from_slice(b"BlockRemoved");
    p.extend_from_slice(&[0x91, 0xfe, 0xa3, b'C', b'P', b'U']);
    p.push(0xc0); // data_parallel_rank: nil
    let batch = decode_batch(&p).unwrap();
    assert_eq!(batch.ts, 1.5);
    assert_eq!(batch.data_parallel_rank, None);
    assert_eq!(
        batch.events,
        vec![
            KvEvent::Stored {
                blocks: vec![(-2i64) as u64, xxh3_64(&[1, 2])],
                parent: None,
                token_ids: vec![1, 2],
                block_size: 1,
                lora_id: Some(7),
                medium: Medium::Gpu,
            },
            KvEvent::Unknown,
            KvEvent::Removed {
                blocks: vec![(-2i64) as u64],
                medium: Medium::Offloaded,
            },
        ]
    );
}

#[test]
fn bad_payloads_name_the_field_and_never_allocate_what_they_declare() {
    // an array of 2^32 − 1 events in 10 bytes
    let huge = [0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00];
    assert!(matches!(
        decode_batch(&huge),
        Err(KvEventError::Field { field: "batch", .. })
    ));
    let deep = [0x91; 32];
    assert_eq!(decode_batch(&deep), Err(bad("batch", "nested too deep")));
    assert_eq!(
        decode_batch(&[0x92, 0xa1, b'x', 0x90]),
        Err(bad("ts", "must be a number"))
    );
    assert_eq!(
        decode_batch(&[0x92, 0x00, 0x00]),
        Err(bad("events", "must be an array"))
    );
    // ["BlockStored", [1], nil, [1], 0]: a block size of 0
    let mut zero = vec![0x92, 0x00, 0x91, 0x95, 0xab];
    zero.extend_from_slice(b"BlockStored");
    zero.extend_from_slice(&[0x91, 0x01, 0xc0, 0x91, 0x01, 0x00]);
    assert_eq!(
        decode_batch(&zero),
        Err(bad("block_size", "must be a positive integer"))
    );
    assert_eq!(
        decode_batch(&[0x92, 0x00]),
        Err(bad(
            "batch",
            "declares more elements than the payload holds"
        ))
    );
    assert_eq!(
        decode_batch(&[0x92, 0xcf, 0x00]),
        Err(bad("batch", "truncated"))
    );
    assert_eq!(
        decode_batch(&vec![0u8; MAX_PAYLOAD_BYTES + 1]),
        Err(KvEventError::TooLarge(MAX_PAYLOAD_BYTES + 1))
    );
}

#[test]
fn an_unknown_event_is_left_out_when_written_never_written_as_another() {
    let batch = KvEventBatch {
        ts: 0.0,
        events: vec![KvEvent::Unknown, KvEvent::Cleared, KvEvent::Unknown],
        data_parallel_rank: None,
    };
    let read = decode_batch(&encode_batch(&batch)).unwrap();
    assert_eq!(read.events, vec![KvEvent::Cleared]);
}

#[test]
fn long_strings_arrays_and_maps_read_with_their_sized_lengths() {
    // ["BlockRemoved", array16 of 2 hashes, str8 "GPU"] in a batch whose events are an array32
    let mut p = vec![0x92, 0x00, 0xdd, 0, 0, 0, 1, 0x93, 0xd9, 12];
    p.extend_from_slice(b"BlockRemoved");
    p.extend_from_slice(&[0xdc, 0, 2, 0x05, 0x06, 0xda, 0, 3]);
    p.extend_from_slice(b"GPU");
    assert_eq!(
        decode_batch(&p).map(|b| b.events),
        Ok(vec![KvEvent::Removed {
            blocks: vec![5, 6],
            medium: Medium::Gpu
        }])
    );
    // a map16 event with one entry, its tag
    let mut m = vec![0x92, 0x00, 0x91, 0xde, 0, 1, 0xa4];
    m.extend_from_slice(b"type");
    m.push(0xb0);
    m.extend_from_slice(b"AllBlocksCleared");
    assert_eq!(
        decode_batch(&m).map(|b| b.events),
        Ok(vec![KvEvent::Cleared])
    );
}

#[test]
fn the_sequence_frame_is_eight_bytes_big_endian_and_signed() {
    assert_eq!(decode_sequence(&encode_sequence(258)), Ok(258));
    assert_eq!(decode_sequence(&[0, 0, 0, 0, 0, 0, 1, 2]), Ok(258));
    assert_eq!(decode_sequence(&[0xff; 8]), Ok(-1));
    assert_eq!(decode_sequence(&[1, 2]), Err(KvEventError::Sequence(2)));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_batch(&bytes);
    }

    #[test]
    fn any_encoded_batch_decodes_to_itself(
        blocks in proptest::collection::vec(any::<u64>(), 0..40),
        parent in proptest::option::of(any::<u64>()),
        ts in 0.0f64..2e9,
    ) {
        let batch = KvEventBatch {
            ts,
            events: vec![
                stored(blocks.clone(), parent, Medium::Gpu),
                KvEvent::Removed { blocks, medium: Medium::Gpu },
            ],
            data_parallel_rank: None,
        };
        prop_assert_eq!(decode_batch(&encode_batch(&batch)), Ok(batch));
    }
}
