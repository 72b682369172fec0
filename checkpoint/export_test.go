package checkpoint

// SlotOfForTest exposes the package's placement so the external tests can check it agrees with
// embedding.Slot.
var SlotOfForTest = slotOf
