package shard

import "github.com/cespare/xxhash/v2"

// FeatureID maps a categorical value of a field to a 64-bit feature id: xxhash64 of the value,
// salted by the field and passed through a bijective mixer. The same value in two different
// fields never gets the same id (the salt differs and the mixer is a bijection); two different
// values collide with probability about 2^-64 per pair.
func FeatureID(field int, value []byte) uint64 {
	return mix64(xxhash.Sum64(value) ^ fieldSalt(field))
}

// FeatureIDString is FeatureID for a string value.
func FeatureIDString(field int, value string) uint64 {
	return mix64(xxhash.Sum64String(value) ^ fieldSalt(field))
}

func fieldSalt(field int) uint64 { return mix64(uint64(field) + 0x632be59bd9b4e019) }
