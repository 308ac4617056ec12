"""Rules every layer shares, each with one home: devices and machine identity, files written safely."""
