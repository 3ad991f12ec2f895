//go:build !linux

package resolver

func orderByRegistration(*Table) {}
