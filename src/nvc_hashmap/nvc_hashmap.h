// nvc_hashmap.h: test hooks of the NVC-Hashmap (src/nvc_hashmap/nvc_hashmap.cc).
//
// The index itself is reached through OpenIndex("nvc_hashmap", ...); this
// header only exposes what tests need to drive the erratum scenario
// deterministically (docs/nvc_hashmap.md, "The erratum").
#pragma once

#include <cstdint>

#include "pmindex/index.h"

namespace pmindex::nvc_hashmap_testing {

// Called by an inserting thread right after the compare-and-swap that links
// its new node (or a bucket's dummy node: key is then empty) and before that
// link is persisted. nullptr removes the hook. Process-wide; tests only.
using LinkHook = void (*)(Slice key);
void SetAfterLinkHook(LinkHook hook);
// Called by an inserting thread (regular nodes only) right before the
// compare-and-swap that links its node, after the node was persisted: a
// test may change the predecessor's word meanwhile so that the CAS fails
// (e.g. insert the same key from another thread: the insert then finds the
// key and gives its node back). nullptr removes the hook.
void SetBeforeLinkHook(LinkHook hook);
// Called by an updating thread right after it stored the new value into a
// node's value word and before it persisted it. nullptr removes the hook.
void SetAfterValueStoreHook(LinkHook hook);
// Called by an updating thread after it checked that the node is not marked
// and right before its store into the value word. nullptr removes the hook.
void SetBeforeValueStoreHook(LinkHook hook);
// Called by a removing thread right after the compare-and-swap that marks
// the node's next word (the remove's linearization point) and before it
// persists the mark. nullptr removes the hook.
void SetAfterMarkHook(LinkHook hook);
// Called by a finding thread after its search found the key's node and
// before it loads the node's value word. nullptr removes the hook.
void SetFindHook(LinkHook hook);
// Consulted by the eager bucket initialisation (InitBatch) for each bucket it
// is about to claim: true makes the bucket's slot lookup fail, as when the
// pool is full while allocating the slot's segment. nullptr removes it.
using BucketFailHook = bool (*)(uint64_t bucket);
void SetInitBatchSlotFailHook(BucketFailHook hook);

// Pools created after this call are written in format `version`: 5 (links
// without tags, as a version 5 build writes them), 6 (recovered by the list
// walk) or 0 (the current format, the default). Process-wide; tests of older
// pools only.
void SetCreateFormatVersion(uint32_t version);

// How many times (process-wide) a thread found no free slab slot, got
// PoolFull for a new slab and took the retry path (reclaim, then the shared
// list, then one more slab).
uint64_t SlabRefillRetries();

// The split-order key of a user key (bit-reversed 63-bit hash with the low bit
// set): nodes are sorted by it, so tests can pick keys that are neighbours.
uint64_t SplitOrderKey(KeyKind kind, Slice key);

// The default number of thread slots of an index (threads using it at once;
// parameter max_threads): tests run more threads than this to catch a slot
// that is never given back.
int MaxThreadSlots();
// The number of threads that walked the list in the index's crash recovery
// at open (0: the open found a clean close).
int RecoveryWalkers(Index* idx);
// Whether the index's crash recovery at open was the slab scan (nvc_scan.cc)
// rather than the list walk.
bool RecoveryScanned(Index* idx);
// true: crash recovery walks the list even in pools the slab scan could
// recover (tests comparing the two). Process-wide.
void SetForceWalkRecovery(bool on);
// The current bucket count of an nvc_hashmap index (tests of growth).
uint64_t BucketCount(Index* idx);

}  // namespace pmindex::nvc_hashmap_testing
