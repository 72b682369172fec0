package ps

import "github.com/elasticps/elasticps/internal/slothash"

// idHash is the hash embedding.Slot takes (internal/slothash), inlined in loops over ids.
func idHash(id uint64) uint64 { return slothash.Hash(id) }

// hashSlot is the slot of an id whose idHash is h, among slots: embedding.Slot(id, slots).
func hashSlot(h uint64, slots int) int { return slothash.Slot(h, slots) }

// slotOf is embedding.Slot(id, slots), inlined.
func slotOf(id uint64, slots int) int { return slothash.Of(id, slots) }
