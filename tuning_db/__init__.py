"""Tuning databases, one JSON file per device, written by `layoutgen tune`; installed as package data."""
