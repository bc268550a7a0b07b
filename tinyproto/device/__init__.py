"""The device layer: PlatformIO / avr-gcc builds, the simulators, the serial protocol, flashing. Knows a model only
through model.json and the generated headers, never a family. Layer: device."""
