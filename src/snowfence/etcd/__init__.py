"""Everything that talks to etcd, in three parts that import in one direction.

- :mod:`.client` (``Connection``): the etcd client library behind one boundary:
  endpoints, TLS, authentication, the deadline of every call, moving on to the
  next member after a failure, rebuilding the client after repeated ones, and
  translating the library's errors into snowfence errors (``etcd_call``).
- :mod:`.keys`: the keys under ``/snowfence/<cluster>/`` and how their records read.
- the lease store (``EtcdStore``, ``EtcdLease``) is the storage layer's
  (:mod:`snowfence.store.etcd`): a worker's leases on worker IDs, the claim and mark
  transactions, and the store's genesis record, built on ``client`` and ``keys``.
- :mod:`.cluster` (``Cluster``): the cluster's nodes and regions (the broker's
  membership) and its census of worker IDs (``snowfence status --etcd``).

The lease store and ``cluster`` each build on ``client`` and ``keys`` and never on
each other: the broker's membership holds no lease store. Importing this
package does not import the client library (an optional extra); building a
client does.
"""
