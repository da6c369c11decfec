//! End-to-end harness and scenarios against a real kube-apiserver and etcd.
