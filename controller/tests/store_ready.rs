//! Several tasks waiting for one reflector store all wake when it fills (kube's own
//! `Store::wait_until_ready` wakes only the last of concurrent waiters).

use std::time::Duration;

use kube::runtime::{reflector, watcher};
use smolvm_api::SmolVMNode;

#[tokio::test]
async fn every_concurrent_waiter_wakes_when_the_store_fills() {
    let (store, mut writer) = reflector::store::<SmolVMNode>();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { smolvm_controller::store_ready(&store).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitDone);
    for waiter in waiters {
        let woke = tokio::time::timeout(Duration::from_secs(5), waiter).await;
        assert!(matches!(woke, Ok(Ok(true))), "a waiter never woke: {woke:?}");
    }
}
