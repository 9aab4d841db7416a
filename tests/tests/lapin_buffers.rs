//! The second fix in hourglass's lapin (vendor/README.md): a connection's
//! frame buffers stay untouched until frames go through them and keep their
//! data at their start, so a busy connection holds resident only the pages
//! of its largest read or write, not the whole 8 MiB.

use std::time::Duration;

use hourglass_e2e::*;

// The host's allocator (host/src/main.rs). It gives a large zeroed allocation
// pages as the kernel hands them, resident only once touched, as in `serve`;
// glibc's `calloc` may clear a reused region at once, which would hide what
// this test measures.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The process's resident memory, KiB (`VmRSS`).
fn resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).expect("VmRSS in /proc/self/status");
    line.split_whitespace().nth(1).and_then(|kib| kib.parse().ok()).expect("VmRSS in KiB")
}

/// Publishes `bytes` in 1,000-byte messages on `connection` to a queue of
/// its own and consumes them there: that many bytes through each of its
/// buffers, out and in.
async fn carry(connection: &lapin::Connection, bytes: usize) {
    const BATCH: usize = 200;
    const BODY: usize = 1_000;
    let mut destination = Destination::declare(connection, "buffers").await;
    // Deleted also when a publish or a receive fails the test.
    let cleanup = Cleanup::declared(&[]);
    cleanup.queue(&destination.name);
    let publishing = connection.create_channel().await.unwrap();
    publishing.confirm_select(lapin::options::ConfirmSelectOptions::default()).await.unwrap();
    let body = vec![b'x'; BODY];
    for _ in 0..bytes.div_ceil(BATCH * BODY) {
        let confirms = futures_util::future::join_all((0..BATCH).map(|_| async {
            publishing.basic_publish("".into(), destination.name.as_str().into(), Default::default(), &body, Default::default()).await.unwrap().await.unwrap()
        }))
        .await;
        assert!(confirms.iter().all(|confirm| confirm.is_ack()));
        destination.receive(BATCH, Duration::from_secs(10)).await;
    }
}

/// hourglass's lapin keeps a connection's buffers untouched until a frame
/// goes through them, and their data at their start (vendor/README.md, the
/// second fix): a connection that carries several times its buffers' 4 MiB
/// each way holds resident only the pages of its largest read or write. As
/// lapin comes, both buffers are written whole when the connection opens,
/// 8 MiB a connection.
///
/// Four such connections are measured against four asking for 8 KiB frames
/// (256 KiB buffers) carrying as much, which cost the process the same but
/// for their buffers: unpatched about 28 MiB more, patched about the same,
/// give or take the few MiB a loaded machine moves the process's memory by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_connections_keep_only_a_little_of_their_buffers_resident() {
    const CONNECTIONS: usize = 4;
    const CARRIED: usize = 12 * 1024 * 1024;
    let url = amqp_url();
    let small_frames = format!("{url}{}frame_max=8192", if url.contains('?') { '&' } else { '?' });
    // What the first connection of a process makes once (the runtime's, the TLS roots') is made before measuring.
    let warming = connect_to(&small_frames).await;
    carry(&warming, 1).await;
    let carry_on = async |url: &str| {
        let connections = futures_util::future::join_all((0..CONNECTIONS).map(|_| connect_to(url))).await;
        futures_util::future::join_all(connections.iter().map(|connection| carry(connection, CARRIED))).await;
        connections
    };

    let start = resident_kib();
    let _small = carry_on(&small_frames).await;
    let after_small = resident_kib();
    let default = carry_on(&url).await;
    let after_default = resident_kib();
    assert_eq!(default[0].configuration().frame_max(), 131_072, "the test broker's default frame_max: 4 MiB buffers each way");

    let (small_grew, default_grew) = (after_small.saturating_sub(start), after_default.saturating_sub(after_small));
    assert!(
        default_grew < small_grew + 8 * 1024,
        "carrying 12 MiB each way on each of {CONNECTIONS} connections, those with 128 KiB frames grew the process by {default_grew} KiB, those with 8 KiB frames by {small_grew} KiB; their whole buffers would be 32,768 KiB"
    );
}
