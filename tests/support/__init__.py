"""Helpers of the test suite: fakes named as such (engines, servers, Ray), fault
injection, records and runs built for tests, and runners of pytest sessions."""
