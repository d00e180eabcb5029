//! An origin per room (`[room.origin]`), over real HTTP: each room's
//! admitted requests reach its own origin on connections of their own,
//! the rooms without one reach `[origin]`, and a room whose origin is
//! down gets the 502 page while the others are served.

mod support;

use std::sync::atomic::Ordering;

use support::{from_origin, origin::Origin, room, Harness};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_room_reaches_its_own_origin() {
    let drops = Origin::start().await;
    let drops_url: http::Uri = format!("http://{}", drops.addr).parse().unwrap();
    let h = Harness::start(move |c| {
        let mut drop_room = room("drop", "/drop");
        let mut origin = c.origin.clone();
        origin.url = drops_url.clone();
        drop_room.origin = Some(origin.clone());
        c.rooms.push(drop_room);
        // A port nobody listens on (taken, then let go).
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut gone_room = room("gone", "/gone");
        origin.url = format!("http://{closed}").parse().unwrap();
        gone_room.origin = Some(origin);
        c.rooms.push(gone_room);
    })
    .await;
    let shop_before = h.origin.connections.load(Ordering::SeqCst);
    let v = h.visitor();
    for _ in 0..3 {
        let resp = v.get(h.url("/drop/sneakers")).send().await.unwrap();
        assert!(from_origin(&resp));
        let echo: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(echo["uri"], "/drop/sneakers");
    }
    assert!(drops.connections.load(Ordering::SeqCst) >= 1);
    assert_eq!(
        h.origin.connections.load(Ordering::SeqCst),
        shop_before,
        "the drop room's requests never reach [origin]"
    );
    let resp = v.get(h.url("/shop")).send().await.unwrap();
    assert!(from_origin(&resp));
    assert!(h.origin.connections.load(Ordering::SeqCst) > shop_before);

    // A room whose origin is down gets the 502 page; the others are
    // still served.
    let resp = h.visitor().get(h.url("/gone/")).send().await.unwrap();
    assert_eq!(resp.status(), 502);
    assert!(!from_origin(&resp));
    assert!(from_origin(
        &h.visitor().get(h.url("/drop/")).send().await.unwrap()
    ));
    assert!(from_origin(
        &h.visitor().get(h.url("/")).send().await.unwrap()
    ));
}
