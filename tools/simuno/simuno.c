/* simuno: a cycle-exact simulated Arduino Uno (ATmega328P) that behaves like a serial port.
 *
 *   simuno [--pty | --stdio] [--markers FILE | --markers-fd N] [--timeout-cycles N] [--mcu atmega328p]
 *          [--freq 16000000] [--parent-pipe] [--eeprom FILE] [-v] firmware.elf
 *   simuno --bootloader BOOT.hex [--flash FILE] [--eeprom FILE] [--mcu M] [--freq F] [--parent-pipe] [-v]
 *
 * The serial USART (USART0; USART1 on the ATmega32U4, which has no USART0) is connected either to a fresh pseudo-terminal (--pty, the default: prints exactly one line
 * "PTY /dev/pts/N" on stdout, then a program opens that path like a USB serial port) or to
 * stdin/stdout (--stdio, binary clean, for `pio test` and pipes). Every write to GPIOR0 is a marker:
 * "<value> <cycle>" goes to --markers FILE (or the already open file descriptor --markers-fd N), one flushed
 * line per write, where <cycle> is avr->cycle at the start of the OUT/STS instruction (so the difference of two
 * markers is an exact cycle count).
 *
 * --parent-pipe (with --pty): stdin is a pipe from the parent process; when it reaches EOF (the parent closed
 * it, or died however abruptly) simuno exits, so no simulator outlives the program that started it.
 *
 * --eeprom FILE: the MCU's EEPROM persists in FILE, a raw image (1024 bytes on the ATmega328P). It is loaded at
 * start if it exists (a shorter file fills the start, the rest stays erased, 0xFF) and written back whenever
 * simuno stops (also on SIGTERM and when the parent pipe closes), so a restart is like a power cycle.
 * Without it the EEPROM starts erased and is forgotten, as before.
 *
 * Board mode (--bootloader): the chip behaves at its port like a real board with a serial bootloader, so the
 * real upload path (avrdude -> bootloader -> self-programming) runs unchanged:
 *   - flash starts erased (or from --flash FILE, a raw image of the whole flash), the bootloader's Intel HEX is
 *     written over it, and every reset starts at the boot section (the HEX's start record, else its lowest
 *     address): the BOOTRST fuse of a real board;
 *   - power-on reset at start (MCUSR = PORF); an external reset (MCUSR = EXTRF) whenever a program opens the pty,
 *     which is what the USB bridge's DTR line and the reset capacitor do on an Uno or a Mega;
 *   - the simulation is paced to real time, so the bootloader's watchdog window and avrdude's timeouts relate
 *     as on the board; if the host cannot keep up, simulated time slows down instead of racing to catch up;
 *   - a crash (erased or half-written flash) slides to the boot section like the real CPU does through 0xFFFF
 *     words; sleeping with interrupts off halts the chip until the next reset. Neither ends simuno;
 *   - flash and EEPROM are written to their files (atomically) when they changed: every second, when the
 *     program on the port closes it, and at exit. The directory of --flash is locked while simuno runs.
 *   Runs until SIGINT/SIGTERM (exit 0) or until the --parent-pipe closes (exit 4).
 *
 * Exit status: 0 the firmware slept with interrupts disabled (its way of saying "done"), or board mode stopped
 * by a signal; 1 usage or load error; 2 the simulated CPU crashed; 3 --timeout-cycles reached; 4 the
 * --parent-pipe closed; 128+signo on SIGTERM/SIGINT/SIGHUP.
 *
 * Built against libsimavr (Debian: libsimavr-dev): cc -O2 -std=gnu99 simuno.c -lsimavr -o simuno
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>
#include <libgen.h>

#include <simavr/avr_eeprom.h>
#include <simavr/avr_uart.h>
#include <simavr/sim_avr.h>
#include <simavr/sim_core.h>
#if __has_include(<simavr/sim_core_config.h>)
#include <simavr/sim_core_config.h> /* CONFIG_SIMAVR_VERSION */
#endif
#ifndef CONFIG_SIMAVR_VERSION
#define CONFIG_SIMAVR_VERSION "unknown"
#endif
#include <simavr/sim_cycle_timers.h>
#include <simavr/sim_interrupts.h>
#include <simavr/sim_elf.h>
#include <simavr/sim_irq.h>

#define EXIT_DONE 0
#define EXIT_USAGE 1
#define EXIT_CRASH 2
#define EXIT_TIMEOUT 3
#define EXIT_PARENT_GONE 4

#define GPIOR0_DATA_ADDR 0x3E   /* I/O 0x1E + 0x20: the marker register */
/* The serial port's USART: USART0 (UCSR0A at 0xC0) on the ATmega328P and ATmega2560; the ATmega32U4 has only
 * USART1 (UCSR1A at 0xC8; the Leonardo's Serial1). Same register layout at base + 0, 1, 4, 5. */
#define UCSRA_OFFSET 0
#define UCSRB_OFFSET 1
#define UBRRL_OFFSET 4
#define UBRRH_OFFSET 5
#define U2X_BIT 1
#define RXEN_BIT 4
static char g_uart_name = '0';
static uint16_t g_uart_base = 0xC0;

#define BATCH_INSTRUCTIONS 4096u  /* instructions run between two host I/O services (~50 us of host time) */
#define BATCH_CYCLES 8192u         /* ... and at most this many cycles (~0.5 ms simulated at 16 MHz) */
/* libsimavr 1.6's avr_run_one executes instructions in a loop of its own while the CPU runs, no interrupt is
 * pending or due to be enabled, and fewer cycles have passed than avr->run_cycle_count: the cycles to the next
 * cycle timer, at most avr->run_cycle_limit. The library sets the limit to 1 (one instruction a call) and keeps
 * the count up to date whenever a timer is registered or cancelled. A larger limit runs the instructions
 * between two timer events in one call, with the same cycles. */
#define SIM_RUN_CYCLE_LIMIT 1024u
#define IDLE_CYCLES_BEFORE_WAIT 80000u /* 5 ms simulated of "waiting for RX" before we block on the host fd */
#define IDLE_WAIT_MS 5
#define IO_BUF_SIZE 4096u

typedef struct {
    int use_pty;
    const char *markers_path;
    uint64_t timeout_cycles; /* 0: none */
    const char *mcu;
    uint32_t freq;
    int verbose;
    int parent_pipe;     /* --parent-pipe: stdin is a pipe from the parent; its EOF means "parent gone, exit" */
    const char *eeprom_path; /* --eeprom: load at start if present, save at exit */
    int markers_fd;      /* --markers-fd: an inherited, already open file; -1 if not given */
    const char *bootloader_path; /* --bootloader: board mode (see the header comment) */
    const char *flash_path;      /* --flash: board mode's persistent flash image */
    const char *elf_path;
} options_t;

typedef struct {
    int in_fd;           /* bytes from the host towards the AVR; -1 once closed */
    int out_fd;          /* bytes from the AVR towards the host; -1 once the reader went away */
    int pty_slave_fd;    /* kept open by us so the master never sees a hang-up between clients */
    int parent_fd;       /* --pty --parent-pipe: stdin; EOF there means the parent process is gone */
    uint8_t in_buf[IO_BUF_SIZE];
    size_t in_head, in_len;  /* ring buffer of host bytes not yet given to the UART */
    uint8_t out_buf[IO_BUF_SIZE];
    size_t out_len;
    uint32_t out_age;    /* batches the unflushed output has waited */
    int xoff;            /* the UART's input FIFO is full: do not push (the byte would be dropped) */
    uint32_t rx_polls;   /* firmware read UCSR0A/UDR0 with an empty FIFO (XON pulses) in this batch */
    uint32_t bytes_moved;/* bytes in either direction in this batch */
    avr_t *avr;
    avr_irq_t *uart_irq; /* base of the serial USART's IRQs (INPUT, OUTPUT, XON, XOFF) */
    FILE *markers;
} io_state_t;

static volatile sig_atomic_t g_stop_signal = 0;
static int g_verbose = 0;
static io_state_t g_io;

/* ------------------------------------------------------------------------------------------------ */
/* Logging: libsimavr prints through a global logger; route everything to stderr so stdout stays a   */
/* clean data channel in --stdio mode and carries only the PTY line in --pty mode.                  */

static void sim_logger(avr_t *avr, const int level, const char *format, va_list ap)
{
    (void)avr;
    int threshold = g_verbose ? LOG_TRACE : LOG_ERROR;
    if (level <= threshold && level != LOG_OUTPUT) {
        vfprintf(stderr, format, ap);
    }
}

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("simuno: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(EXIT_USAGE);
}

static void on_signal(int signo)
{
    g_stop_signal = signo;
}

static void install_signal_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a blocked poll()/write() must return EINTR so we can exit */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN); /* a vanished reader shows up as EPIPE, handled in write_all() */
}

/* ------------------------------------------------------------------------------------------------ */
/* Command line                                                                                      */

static void usage(void)
{
    fputs("usage: simuno [--pty | --stdio] [--markers FILE | --markers-fd N] [--timeout-cycles N]\n"
          "              [--mcu atmega328p] [--freq 16000000] [--parent-pipe] [--eeprom FILE] [-v] firmware.elf\n"
          "       simuno --bootloader BOOT.hex [--flash FILE] [--eeprom FILE] [--mcu M] [--freq F]\n"
          "              [--parent-pipe] [-v]\n",
          stderr);
    exit(EXIT_USAGE);
}

static uint64_t parse_u64(const char *text, const char *what)
{
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-') {
        die("%s must be a non-negative integer, got '%s'", what, text);
    }
    return (uint64_t)value;
}

static options_t parse_options(int argc, char **argv)
{
    options_t opt = {1, NULL, 0, "atmega328p", 16000000u, 0, 0, NULL, -1, NULL, NULL, NULL};
    for (int i = 1; i < argc; ++i) {
        const char *arg = argv[i];
        int has_value = i + 1 < argc;
        if (strcmp(arg, "--pty") == 0) {
            opt.use_pty = 1;
        } else if (strcmp(arg, "--stdio") == 0) {
            opt.use_pty = 0;
        } else if (strcmp(arg, "--markers") == 0 && has_value) {
            opt.markers_path = argv[++i];
        } else if (strcmp(arg, "--timeout-cycles") == 0 && has_value) {
            opt.timeout_cycles = parse_u64(argv[++i], "--timeout-cycles");
        } else if (strcmp(arg, "--mcu") == 0 && has_value) {
            opt.mcu = argv[++i];
        } else if (strcmp(arg, "--freq") == 0 && has_value) {
            uint64_t freq = parse_u64(argv[++i], "--freq");
            if (freq == 0 || freq > UINT32_MAX) {
                die("--freq out of range");
            }
            opt.freq = (uint32_t)freq;
        } else if (strcmp(arg, "--parent-pipe") == 0) {
            opt.parent_pipe = 1;
        } else if (strcmp(arg, "--eeprom") == 0 && has_value) {
            opt.eeprom_path = argv[++i];
        } else if (strcmp(arg, "--markers-fd") == 0 && has_value) {
            uint64_t fd = parse_u64(argv[++i], "--markers-fd");
            if (fd > 1023u) {
                die("--markers-fd out of range");
            }
            opt.markers_fd = (int)fd;
        } else if (strcmp(arg, "--bootloader") == 0 && has_value) {
            opt.bootloader_path = argv[++i];
        } else if (strcmp(arg, "--flash") == 0 && has_value) {
            opt.flash_path = argv[++i];
        } else if (strcmp(arg, "-v") == 0 || strcmp(arg, "--verbose") == 0) {
            opt.verbose = 1;
        } else if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            usage();
        } else if (arg[0] == '-' ) {
            fprintf(stderr, "simuno: unknown or incomplete option '%s'\n", arg);
            usage();
        } else if (opt.elf_path == NULL) {
            opt.elf_path = arg;
        } else {
            usage();
        }
    }
    if (opt.bootloader_path != NULL) {
        if (opt.elf_path != NULL || !opt.use_pty || opt.markers_path != NULL || opt.markers_fd >= 0 ||
            opt.timeout_cycles != 0) {
            die("--bootloader runs a board: no firmware.elf, --stdio, markers or --timeout-cycles with it "
                "(upload the application through the bootloader)");
        }
    } else if (opt.elf_path == NULL) {
        usage();
    } else if (opt.flash_path != NULL) {
        die("--flash needs --bootloader (board mode)");
    }
    if (opt.markers_path != NULL && opt.markers_fd >= 0) {
        die("give --markers FILE or --markers-fd N, not both");
    }
    return opt;
}

/* ------------------------------------------------------------------------------------------------ */
/* Host side of the serial line                                                                      */

static void set_nonblocking(int fd)
{
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) {
        fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    }
}

/* Opens a pty pair, puts it in raw mode and returns the master; announces "PTY <path>" on announce_fd. */
static int open_pty(int announce_fd, int *slave_fd_out)
{
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) {
        die("cannot create a pseudo-terminal: %s", strerror(errno));
    }
    const char *slave_path = ptsname(master);
    if (slave_path == NULL) {
        die("ptsname failed: %s", strerror(errno));
    }
    /* Holding the slave open ourselves means the master never reports a hang-up while no client is
     * connected (no busy loop), and bytes the firmware sends before the client opens are kept. */
    int slave = open(slave_path, O_RDWR | O_NOCTTY);
    if (slave < 0) {
        die("cannot open %s: %s", slave_path, strerror(errno));
    }
    struct termios tio;
    if (tcgetattr(slave, &tio) == 0) {
        cfmakeraw(&tio);
        tio.c_cc[VMIN] = 1;
        tio.c_cc[VTIME] = 0;
        tcsetattr(slave, TCSANOW, &tio);
    }
    set_nonblocking(master);
    dprintf(announce_fd, "PTY %s\n", slave_path);
    *slave_fd_out = slave;
    return master;
}

static int parent_gone(io_state_t *io);

/* Writes everything or gives up when the reader is gone; waits (interruptibly) while the pipe is full. */
static void write_all(io_state_t *io, const uint8_t *data, size_t len)
{
    while (len > 0 && io->out_fd >= 0) {
        ssize_t n = write(io->out_fd, data, len);
        if (n > 0) {
            data += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            if (g_stop_signal || parent_gone(io)) {
                return; /* a reader that never drains must not keep us alive after the parent died */
            }
            struct pollfd pfd = {io->out_fd, POLLOUT, 0};
            poll(&pfd, 1, 50);
        } else {
            /* EPIPE/EIO: nobody listens any more; keep simulating, drop the output. */
            io->out_fd = -1;
        }
    }
}

static void flush_output(io_state_t *io)
{
    if (io->out_len > 0) {
        write_all(io, io->out_buf, io->out_len);
        io->out_len = 0;
    }
    io->out_age = 0;
}

/* The default mode hands the host whole frames (a 0x00 ends a tinyproto frame, a newline a line of text) and
 * whatever is left once the firmware waits or a few batches have passed: every write wakes the reader, and a
 * frame in two writes costs the host two wake-ups. Board mode writes after every batch (board_flush_output). */
#define OUTPUT_MAX_AGE_BATCHES 16u
static int g_flush_on_frame_end = 0;

/* True when fd has bytes (or EOF) to read within timeout_ms. poll() instead of O_NONBLOCK because
 * stdin may be a file description shared with the parent shell. */
static int fd_readable(int fd, int timeout_ms)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    int n = poll(&pfd, 1, timeout_ms);
    return n > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

/* Reads what the host has sent, as much as fits in the ring buffer; never blocks. */
static void read_input(io_state_t *io)
{
    while (io->in_fd >= 0 && io->in_len < IO_BUF_SIZE && fd_readable(io->in_fd, 0)) {
        size_t tail = (io->in_head + io->in_len) % IO_BUF_SIZE;
        size_t room = IO_BUF_SIZE - io->in_len;
        size_t contiguous = IO_BUF_SIZE - tail;
        size_t want = room < contiguous ? room : contiguous;
        ssize_t n = read(io->in_fd, io->in_buf + tail, want);
        if (n > 0) {
            io->in_len += (size_t)n;
            io->bytes_moved += (uint32_t)n;
        } else if (n == 0) {
            io->in_fd = -1; /* EOF on stdin: the firmware simply receives nothing more */
        } else if (errno == EINTR) {
            if (g_stop_signal) {
                return;
            }
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return;
        } else {
            io->in_fd = -1;
        }
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* USART <-> host bytes, respecting the UART's XON/XOFF so no byte is dropped                        */

static int uart_rx_enabled(avr_t *avr)
{
    return (avr->data[g_uart_base + UCSRB_OFFSET] >> RXEN_BIT) & 1u;
}

/* Board mode: host bytes reach the UART no faster than the wire carries them (start + 8 data + stop bits at
 * the baud rate the firmware programmed), as on a real board; the default mode delivers as fast as the FIFO
 * takes them. */
static int g_pace_rx = 0;
static uint64_t g_next_rx_cycle = 0;

/* Cycles of one character on the wire at the rate and format the firmware programmed: start bit, 5-9 data
 * bits, parity if enabled, 1 or 2 stop bits, each (UBRR + 1) x 16 cycles (x 8 with U2X). */
#define UCSRC_OFFSET 2
static uint64_t uart_frame_cycles(avr_t *avr)
{
    const uint8_t *io = avr->data + g_uart_base;
    uint32_t ubrr = ((uint32_t)(io[UBRRH_OFFSET] & 0x0Fu) << 8) | io[UBRRL_OFFSET];
    uint32_t divider = ((io[UCSRA_OFFSET] >> U2X_BIT) & 1u) ? 8u : 16u;
    uint32_t size = ((io[UCSRC_OFFSET] >> 1) & 3u) | (((io[UCSRB_OFFSET] >> 2) & 1u) << 2);
    uint32_t data_bits = size <= 3u ? 5u + size : (size == 7u ? 9u : 8u);
    uint32_t parity = ((io[UCSRC_OFFSET] >> 4) & 3u) != 0u;
    uint32_t stop = 1u + ((io[UCSRC_OFFSET] >> 3) & 1u);
    return (uint64_t)(1u + data_bits + parity + stop) * divider * (ubrr + 1u);
}

/* libsimavr 1.6 times the USART (its receive pump and the transmitter's UDRE) with a character length it works
 * out when UBRRL is written: it always counts a parity bit, and it ignores a U2X set afterwards. Both make its
 * line slower than the one programmed (8N1 at 1 Mbaud: 11 bit times instead of 10). Keep its figure equal to
 * the real one, so bytes move no faster and no slower than the configured line allows, both ways. */
static avr_uart_t *g_uart = NULL;

static void uart_find(avr_t *avr)
{
    for (avr_io_t *io = avr->io_port; io != NULL; io = io->next) {
        if (io->kind != NULL && strcmp(io->kind, "uart") == 0 && ((avr_uart_t *)io)->name == g_uart_name) {
            g_uart = (avr_uart_t *)io;
        }
    }
}

static void uart_keep_rate(avr_t *avr)
{
    if (g_uart != NULL) {
        g_uart->cycles_per_byte = uart_frame_cycles(avr);
    }
}

/* Pushes pending host bytes into the UART's input FIFO until it reports full (XOFF) or we run out. */
static void uart_feed(avr_t *avr, io_state_t *io)
{
    uart_keep_rate(avr);
    while (io->in_len > 0 && !io->xoff && uart_rx_enabled(avr)) {
        if (g_pace_rx) {
            if (avr->cycle < g_next_rx_cycle) {
                break; /* the previous byte is still on the wire */
            }
            uint64_t frame = uart_frame_cycles(avr);
            /* back to back while a stream lasts; after a pause the next byte starts now */
            g_next_rx_cycle = avr->cycle - g_next_rx_cycle > frame ? avr->cycle + frame : g_next_rx_cycle + frame;
        }
        uint8_t byte = io->in_buf[io->in_head];
        io->in_head = (io->in_head + 1) % IO_BUF_SIZE;
        io->in_len--;
        avr_raise_irq(io->uart_irq + UART_IRQ_INPUT, byte); /* may raise XOFF synchronously */
    }
}

static void on_uart_output(avr_irq_t *irq, uint32_t value, void *param)
{
    (void)irq;
    io_state_t *io = (io_state_t *)param;
    io->out_buf[io->out_len++] = (uint8_t)value;
    io->bytes_moved++;
    if (io->out_len == IO_BUF_SIZE || (g_flush_on_frame_end && (value == 0u || value == '\n'))) {
        flush_output(io);
    }
}

static void on_uart_xon(avr_irq_t *irq, uint32_t value, void *param)
{
    (void)irq;
    (void)value;
    io_state_t *io = (io_state_t *)param;
    io->xoff = 0;
    io->rx_polls++; /* raised whenever the firmware looks at an empty receiver */
    if (io->in_len > 0) {
        uart_feed(io->avr, io); /* refill right away: the firmware is draining the FIFO */
    }
}

static void on_uart_xoff(avr_irq_t *irq, uint32_t value, void *param)
{
    (void)irq;
    io_state_t *io = (io_state_t *)param;
    io->xoff = value != 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* GPIOR0 markers                                                                                    */

static void on_gpior0_write(avr_t *avr, avr_io_addr_t addr, uint8_t value, void *param)
{
    io_state_t *io = (io_state_t *)param;
    avr->data[addr] = value; /* a write hook must store the value itself */
    if (io->markers != NULL) {
        fprintf(io->markers, "%u %" PRIu64 "\n", (unsigned)value, (uint64_t)avr->cycle);
        fflush(io->markers);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Simulation                                                                                        */

static int g_slept_in_batch = 0;

/* Called when the AVR sleeps with interrupts enabled, for the cycles until the next timer event.
 * libsimavr's default waits in real time; we want "as fast as possible", so only note the idleness
 * (the main loop blocks on the host fd if the firmware stays idle). */
static void on_avr_sleep(avr_t *avr, avr_cycle_count_t how_long)
{
    (void)avr;
    (void)how_long;
    g_slept_in_batch = 1;
}

/* simavr 1.6 logs a data write beyond RAMEND ("Invalid write address ... out of ram") and then performs it
 * anyway, past the end of its malloc'ed RAM. Garbage code (a half-written upload running with a wild stack
 * pointer) would so corrupt this program's heap. Give the whole 16-bit data space a home: such writes then land
 * in memory we own, the core still reports the crash, and the board's crash handling takes over. */
#define DATA_SPACE_BYTES 0x10000u
static void widen_data_space(avr_t *avr)
{
    if ((uint32_t)avr->ramend + 1u >= DATA_SPACE_BYTES) {
        return;
    }
    uint8_t *data = realloc(avr->data, DATA_SPACE_BYTES);
    if (data == NULL) {
        die("out of memory");
    }
    memset(data + avr->ramend + 1u, 0, DATA_SPACE_BYTES - (avr->ramend + 1u));
    avr->data = data;
}

static avr_t *load_avr(const options_t *opt)
{
    if (access(opt->elf_path, R_OK) != 0) {
        die("cannot read firmware %s: %s", opt->elf_path, strerror(errno));
    }
    static elf_firmware_t fw; /* large struct: keep it off the stack */
    memset(&fw, 0, sizeof fw);
    if (elf_read_firmware(opt->elf_path, &fw) != 0) {
        die("%s is not a loadable AVR ELF file", opt->elf_path);
    }
    /* The command line wins over an optional .mmcu section (--mcu / --freq: the board's chip and clock). */
    snprintf(fw.mmcu, sizeof fw.mmcu, "%s", opt->mcu);
    fw.frequency = opt->freq;
    avr_t *avr = avr_make_mcu_by_name(fw.mmcu);
    if (avr == NULL) {
        die("unknown MCU '%s'", opt->mcu);
    }
    avr_init(avr);
    widen_data_space(avr);
    avr->log = opt->verbose ? LOG_TRACE : LOG_ERROR;
    avr_load_firmware(avr, &fw);
    avr->frequency = opt->freq;
    avr->sleep = on_avr_sleep;
    return avr;
}

/* ------------------------------------------------------------------------------------------------ */
/* EEPROM persistence (--eeprom)                                                                     */

/* The MCU's EEPROM bytes and size: libsimavr hands out a pointer to its own array for a GET without a
 * destination, and refuses a range past the end, so the largest accepted power of two is the size. */
static uint8_t *eeprom_bytes(avr_t *avr, uint32_t *size)
{
    for (uint32_t n = 65536u; n >= 16u; n /= 2u) {
        avr_eeprom_desc_t desc = {NULL, 0, n};
        avr_ioctl(avr, AVR_IOCTL_EEPROM_GET, &desc);
        if (desc.ee != NULL) {
            *size = n;
            return desc.ee;
        }
    }
    *size = 0;
    return NULL;
}

static void eeprom_load(avr_t *avr, const char *path)
{
    uint32_t size;
    uint8_t *ee = eeprom_bytes(avr, &size);
    if (ee == NULL) {
        die("--eeprom: this MCU has no EEPROM");
    }
    FILE *file = fopen(path, "rb");
    if (file == NULL) {
        if (errno == ENOENT) {
            return; /* first run: erased EEPROM, written at exit */
        }
        die("cannot read EEPROM image %s: %s", path, strerror(errno));
    }
    size_t n = fread(ee, 1, size, file);
    int longer = fgetc(file) != EOF;
    fclose(file);
    if (longer) {
        die("EEPROM image %s is larger than the %u bytes of EEPROM", path, (unsigned)size);
    }
    if (g_verbose) {
        fprintf(stderr, "simuno: loaded %zu EEPROM bytes from %s\n", n, path);
    }
}

/* Written to a temporary name and renamed: a reader never sees half an image. */
static int eeprom_save(avr_t *avr, const char *path)
{
    uint32_t size;
    uint8_t *ee = eeprom_bytes(avr, &size);
    char tmp[4096];
    if (ee == NULL || snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        return -1;
    }
    FILE *file = fopen(tmp, "wb");
    if (file == NULL) {
        fprintf(stderr, "simuno: cannot write EEPROM image %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    int ok = fwrite(ee, 1, size, file) == size;
    ok = (fclose(file) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "simuno: cannot write EEPROM image %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

static void connect_uart(avr_t *avr, io_state_t *io)
{
    /* No usleep() on UCSR0A polls (it would slow every TX wait to a crawl) and no console echo. */
    uint32_t flags = 0;
    /* USART0 where the MCU has one; else USART1 (the ATmega32U4: its USB port is not simulated). */
    g_uart_name = avr_io_getirq(avr, AVR_IOCTL_UART_GETIRQ('0'), 0) != NULL ? '0' : '1';
    g_uart_base = g_uart_name == '0' ? 0xC0 : 0xC8;
    avr_ioctl(avr, AVR_IOCTL_UART_SET_FLAGS(g_uart_name), &flags);
    io->avr = avr;
    io->uart_irq = avr_io_getirq(avr, AVR_IOCTL_UART_GETIRQ(g_uart_name), 0);
    if (io->uart_irq == NULL) {
        die("this MCU has no USART0 or USART1");
    }
    avr_irq_register_notify(io->uart_irq + UART_IRQ_OUTPUT, on_uart_output, io);
    avr_irq_register_notify(io->uart_irq + UART_IRQ_OUT_XON, on_uart_xon, io);
    avr_irq_register_notify(io->uart_irq + UART_IRQ_OUT_XOFF, on_uart_xoff, io);
    uart_find(avr);
}

/* data_out_fd is the original stdout (main() moved fd 1 to stderr before libsimavr could print). */
static void open_host_side(const options_t *opt, io_state_t *io, int data_out_fd)
{
    io->pty_slave_fd = -1;
    io->parent_fd = -1;
    /* Markers first: once the PTY line is out, the client may already look at the file. */
    if (opt->markers_path != NULL) {
        io->markers = fopen(opt->markers_path, "w");
        if (io->markers == NULL) {
            die("cannot write markers to %s: %s", opt->markers_path, strerror(errno));
        }
    } else if (opt->markers_fd >= 0) {
        /* An inherited anonymous file (the parent keeps no named file that could outlive it). */
        io->markers = fdopen(opt->markers_fd, "w");
        if (io->markers == NULL) {
            die("cannot write markers to file descriptor %d: %s", opt->markers_fd, strerror(errno));
        }
    }
    if (opt->use_pty) {
        int master = open_pty(data_out_fd, &io->pty_slave_fd);
        close(data_out_fd); /* stdout carries nothing but the PTY line: the reader now sees EOF */
        io->in_fd = master;
        io->out_fd = master;
        io->parent_fd = opt->parent_pipe ? STDIN_FILENO : -1;
    } else {
        io->in_fd = STDIN_FILENO;
        io->out_fd = data_out_fd;
    }
}

/* Blocks until the host sends something, the parent pipe changes or timeout_ms passes (firmware idle). */
static void wait_for_host(io_state_t *io, int timeout_ms)
{
    struct pollfd fds[2];
    nfds_t n = 0;
    if (io->in_fd >= 0) {
        fds[n++] = (struct pollfd){io->in_fd, POLLIN, 0};
    }
    if (io->parent_fd >= 0) {
        fds[n++] = (struct pollfd){io->parent_fd, POLLIN, 0};
    }
    if (n > 0) {
        poll(fds, n, timeout_ms);
    } else {
        struct timespec ts = {0, (long)timeout_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* True once the parent's pipe reached EOF (bytes sent on it are ignored). */
static int parent_gone(io_state_t *io)
{
    uint8_t scratch[64];
    while (io->parent_fd >= 0 && fd_readable(io->parent_fd, 0)) {
        ssize_t n = read(io->parent_fd, scratch, sizeof scratch);
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
            return 1;
        }
        if (n < 0) {
            break;
        }
    }
    return 0;
}

/* One simulated step, as libsimavr 1.6's avr_run() does it (avr->run is avr_callback_run_raw: run one instruction
 * if running, process the due cycle timers, sleep if sleeping, service the interrupts if any is pending), with
 * the same effects in the same order. Without its two calls per instruction and the call into the timer list
 * when no timer is due: that bookkeeping was about a third of simuno's CPU (perf), more than half of it the
 * call into avr_cycle_timer_process, which almost always finds the first timer still in the future. When one is
 * due (or there is none) the library's own function runs; the fast path stores the same run_cycle_count. */
static int g_inline_step = 0; /* set in main: libsimavr 1.6 (whose avr_run this replicates), SIMUNO_LIBRARY_STEP unset */

static inline int simuno_step(avr_t *avr)
{
    if (!g_inline_step || avr->run != avr_callback_run_raw) {
        /* libsimavr swaps in a one-time callback of its own, e.g. the watchdog's reset (a board's bootloader
         * starts the application through it): let the library run that step. */
        return avr_run(avr);
    }
    avr_flashaddr_t new_pc = avr->pc;
    if (avr->state == cpu_Running) {
        new_pc = avr_run_one(avr);
    }
    avr_cycle_count_t sleep;
    avr_cycle_timer_slot_p next = avr->cycle_timers.timer;
    if (next != NULL && next->when > avr->cycle) {
        sleep = next->when - avr->cycle;
        avr->run_cycle_count = sleep < avr->run_cycle_limit ? sleep : avr->run_cycle_limit;
        if (avr->run_cycle_count == 0) {
            avr->run_cycle_count = 1;
        }
    } else {
        sleep = avr_cycle_timer_process(avr);
    }
    avr->pc = new_pc;
    if (avr->state == cpu_Sleeping) {
        if (!avr->sreg[S_I]) {
            /* sleeping with interrupts off: the firmware's "done" (1.6 only logs it and stops; later libsimavr
             * versions also free the core, which simuno still reads afterwards) */
            if (avr->log) {
                AVR_LOG(avr, LOG_TRACE, "simavr: sleeping with interrupts off, quitting gracefully\n");
            }
            avr->state = cpu_Done;
            return avr->state;
        }
        avr->sleep(avr, sleep);
        avr->cycle += 1 + sleep;
    }
    if ((avr->state == cpu_Running || avr->state == cpu_Sleeping) && avr->interrupt_state) {
        avr_service_interrupts(avr);
    }
    return avr->state;
}

#ifdef SIMUNO_PROFILE
/* tools/profile_firmware.py builds simuno with -DSIMUNO_PROFILE: the instructions and cycles of every program
 * counter (word address), written as "<pc hex> <instructions> <cycles>" lines to $SIMUNO_PROFILE when simuno
 * stops; the steps asleep go on one line of their own (pc 0x1FFFE). The normal build has none of this. */
#define PROFILE_SLOTS 0x10000u
static uint64_t g_profile_count[PROFILE_SLOTS], g_profile_cycles[PROFILE_SLOTS];

static void profile_step(avr_t *avr)
{
    uint32_t slot = avr->state == cpu_Sleeping ? PROFILE_SLOTS - 1u : (avr->pc >> 1) % (PROFILE_SLOTS - 1u);
    uint64_t before = avr->cycle;
    simuno_step(avr);
    g_profile_count[slot]++;
    g_profile_cycles[slot] += avr->cycle - before;
}

static void profile_write(void)
{
    const char *path = getenv("SIMUNO_PROFILE");
    FILE *file = path != NULL ? fopen(path, "w") : NULL;
    if (file == NULL) {
        return;
    }
    for (uint32_t slot = 0; slot < PROFILE_SLOTS; ++slot) {
        if (g_profile_count[slot] != 0) {
            fprintf(file, "%x %" PRIu64 " %" PRIu64 "\n", slot * 2u, g_profile_count[slot], g_profile_cycles[slot]);
        }
    }
    fclose(file);
}
#define RUN_ONE(avr) (profile_step(avr), (avr)->state)
#else
#define RUN_ONE(avr) simuno_step(avr)
static void profile_write(void)
{
}
#endif

static int finish(avr_t *avr, io_state_t *io, int status)
{
    profile_write();
    flush_output(io);
    if (io->markers != NULL) {
        fclose(io->markers);
        io->markers = NULL;
    }
    if (g_verbose) {
        fprintf(stderr, "simuno: stopped at cycle %" PRIu64 " (status %d)\n", (uint64_t)avr->cycle, status);
    }
    return status;
}

/* Runs up to BATCH_INSTRUCTIONS instructions; returns the CPU state afterwards. The batch ends early once the
 * firmware has slept IDLE_CYCLES_BEFORE_WAIT cycles in a row with no host byte on the way: it waits for the
 * host. Asleep, each step jumps to the next timer event, so a whole batch of them is simulated idle time, host
 * CPU spent on every wait for the host (once per answer the host waits for) and nothing gained. */
static int run_batch(avr_t *avr, const io_state_t *io, uint64_t timeout_cycles, int *waits_for_host)
{
    int state = avr->state;
    *waits_for_host = 0;
    uint64_t asleep_since = 0;
    int asleep = 0;
    uint64_t batch_end = avr->cycle + BATCH_CYCLES;
    for (uint32_t i = 0; i < BATCH_INSTRUCTIONS && avr->cycle < batch_end; ++i) {
        state = RUN_ONE(avr);
        if (state == cpu_Done || state == cpu_Crashed || state == cpu_Stopped) {
            break;
        }
        if (timeout_cycles != 0 && avr->cycle >= timeout_cycles) {
            break;
        }
        if (state != cpu_Sleeping) {
            asleep = 0;
        } else if (!asleep) {
            asleep = 1;
            asleep_since = avr->cycle;
        } else if (avr->cycle - asleep_since >= IDLE_CYCLES_BEFORE_WAIT && io->in_len == 0) {
            *waits_for_host = 1;
            break;
        }
    }
    return state;
}

static int simulate(avr_t *avr, io_state_t *io, uint64_t timeout_cycles)
{
    g_flush_on_frame_end = 1;
#ifndef SIMUNO_PROFILE /* the profile counts every instruction's program counter: one a step */
    if (g_inline_step) {
        avr->run_cycle_limit = SIM_RUN_CYCLE_LIMIT;
    }
#endif
    uint64_t idle_cycles = 0;
    uint32_t batches = 0;
    for (;;) {
        uint64_t batch_start = avr->cycle;
        io->rx_polls = 0;
        io->bytes_moved = 0;
        g_slept_in_batch = 0;

        int asleep_for_host = 0;
        int state = run_batch(avr, io, timeout_cycles, &asleep_for_host);
        uart_keep_rate(avr);
        if (++io->out_age >= OUTPUT_MAX_AGE_BATCHES || g_slept_in_batch || io->rx_polls > 0) {
            flush_output(io); /* the firmware waits (sleeps or polls the receiver), or the output is old */
        }
        if (state == cpu_Done) {
            return finish(avr, io, EXIT_DONE);
        }
        if (state == cpu_Crashed || state == cpu_Stopped) {
            fprintf(stderr, "simuno: firmware crashed at pc=0x%04x, cycle %" PRIu64 "\n", (unsigned)avr->pc,
                    (uint64_t)avr->cycle);
            return finish(avr, io, EXIT_CRASH);
        }
        if (timeout_cycles != 0 && avr->cycle >= timeout_cycles) {
            fprintf(stderr, "simuno: timeout after %" PRIu64 " cycles\n", (uint64_t)avr->cycle);
            return finish(avr, io, EXIT_TIMEOUT);
        }
        if (g_stop_signal) {
            return finish(avr, io, 128 + (int)g_stop_signal);
        }
        /* ~every 3 ms of host time while busy, and after every idle wait below */
        if ((++batches & 63u) == 0 && parent_gone(io)) {
            return finish(avr, io, EXIT_PARENT_GONE);
        }

        read_input(io);
        uart_feed(avr, io);

        /* Idle = no byte moved, none waiting for the UART, and the firmware either sleeps now (run_batch ended
         * on IDLE_CYCLES_BEFORE_WAIT asleep, or the batch ends asleep after sleeping in it: a firmware woken by
         * a periodic timer) or kept polling an empty receiver (a dense stream of XON pulses; a computation that
         * peeks at the UART now and then is not idle). A batch that slept between the bytes of a request and
         * then computed its answer is not idle: waiting for the host there (who waits for that answer) cost a
         * whole IDLE_WAIT_MS per request, most of a streaming family's int8 pass. */
        int polling = io->rx_polls >= BATCH_INSTRUCTIONS / 32u && io->in_len == 0;
        int asleep_now = asleep_for_host || (g_slept_in_batch && state == cpu_Sleeping);
        int idle = io->bytes_moved == 0 && io->in_len == 0 && (polling || asleep_now);
        idle_cycles = idle ? idle_cycles + (avr->cycle - batch_start) : 0;
        if (idle_cycles >= IDLE_CYCLES_BEFORE_WAIT) {
            wait_for_host(io, IDLE_WAIT_MS);
            if (parent_gone(io)) {
                return finish(avr, io, EXIT_PARENT_GONE);
            }
            read_input(io);
            uart_feed(avr, io);
        }
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Board mode (--bootloader): a board with a serial bootloader, at its port                          */

#define BOARD_BATCH_INSTRUCTIONS 1024u /* ~0.1 ms simulated at 16 MHz between two looks at the port ... */
#define BOARD_BATCH_PER_SECOND 10000u  /* ... and never more than 0.1 ms: asleep, one step is up to 1000 cycles */
#define BOARD_MAX_LAG_NS 20000000LL    /* 20 ms behind the wall clock: stop owing time (no catch-up burst) */
#define BOARD_MIN_SLEEP_NS 250000LL    /* sleep only when at least 0.25 ms ahead (timer slack, syscalls) */
#define BOARD_MAX_SLEEP_NS 1000000LL   /* ... and at most 1 ms at a time before looking at the port again */
#define BOARD_SAVE_PERIOD_NS 1000000000LL
#define MCUSR_DATA_ADDR 0x54           /* ATmega328P and ATmega2560 alike: I/O 0x34 */
#define MCUSR_PORF 0x01u
#define MCUSR_EXTRF 0x02u

typedef struct {
    avr_t *avr;
    const char *flash_path;   /* NULL: flash is forgotten at exit */
    const char *eeprom_path;  /* NULL: EEPROM is forgotten at exit */
    uint8_t *flash_saved;     /* flash as last written to flash_path (to save only when it changed) */
    uint8_t *eeprom_saved;
    uint32_t flash_size;
    uint32_t boot_start;      /* byte address of the boot section: where every reset starts */
    int halted;               /* slept with interrupts off: nothing runs until the next reset */
    int connected;            /* a program has the pty open (the master does not report a hang-up) */
    uint64_t resets, crashes;
} board_t;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int hex_nibble(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* Intel HEX into flash. Our own reader because libsimavr 1.6's read_ihex_chunks() refuses the start-address
 * records (type 03/05) that Debian's bootloader files carry. Returns the start address (from a 03/05 record)
 * or, without one, the lowest address written. Any malformed line is a clear error. */
static uint32_t load_ihex(const char *path, uint8_t *flash, uint32_t flash_size)
{
    FILE *file = fopen(path, "r");
    if (file == NULL) {
        die("cannot read bootloader %s: %s", path, strerror(errno));
    }
    char line[600];
    uint32_t base = 0, lowest = UINT32_MAX, start = UINT32_MAX;
    unsigned line_no = 0;
    int seen_eof = 0;
    while (!seen_eof && fgets(line, sizeof line, file) != NULL) {
        line_no++;
        size_t len = strcspn(line, "\r\n");
        if (len == 0) {
            continue;
        }
        uint8_t rec[300];
        if (line[0] != ':' || len % 2 != 1 || (len - 1) / 2 > sizeof rec || len < 11) {
            die("%s line %u is not an Intel HEX record", path, line_no);
        }
        size_t n = (len - 1) / 2;
        uint8_t sum = 0;
        for (size_t i = 0; i < n; ++i) {
            int hi = hex_nibble(line[1 + 2 * i]), lo = hex_nibble(line[2 + 2 * i]);
            if (hi < 0 || lo < 0) {
                die("%s line %u holds a non-hex character", path, line_no);
            }
            rec[i] = (uint8_t)(hi * 16 + lo);
            sum = (uint8_t)(sum + rec[i]);
        }
        uint8_t count = rec[0], type = rec[3];
        uint32_t offset = ((uint32_t)rec[1] << 8) | rec[2];
        if (n != (size_t)count + 5u || sum != 0) {
            die("%s line %u: wrong length or checksum", path, line_no);
        }
        const uint8_t *data = rec + 4;
        switch (type) {
        case 0x00: /* data */
            for (uint32_t i = 0; i < count; ++i) {
                uint32_t addr = base + offset + i;
                if (addr >= flash_size) {
                    die("%s writes address 0x%05x, past the %u bytes of flash of this MCU", path, addr,
                        (unsigned)flash_size);
                }
                flash[addr] = data[i];
                lowest = addr < lowest ? addr : lowest;
            }
            break;
        case 0x01:
            seen_eof = 1;
            break;
        case 0x02: /* extended segment address: base = segment * 16 */
            base = (((uint32_t)data[0] << 8) | data[1]) << 4;
            break;
        case 0x03: /* start segment address CS:IP */
            start = ((((uint32_t)data[0] << 8) | data[1]) << 4) + (((uint32_t)data[2] << 8) | data[3]);
            break;
        case 0x04: /* extended linear address: upper 16 bits */
            base = (((uint32_t)data[0] << 8) | data[1]) << 16;
            break;
        case 0x05: /* start linear address */
            start = ((uint32_t)data[0] << 24) | ((uint32_t)data[1] << 16) | ((uint32_t)data[2] << 8) | data[3];
            break;
        default:
            die("%s line %u: unknown record type %u", path, line_no, (unsigned)type);
        }
    }
    fclose(file);
    if (!seen_eof || lowest == UINT32_MAX) {
        die("%s is not a complete Intel HEX file (no data or no end record)", path);
    }
    if (start == UINT32_MAX) {
        start = lowest;
    }
    if (start >= flash_size || start % 2 != 0) {
        die("%s starts at 0x%05x, not a word address inside flash", path, start);
    }
    return start;
}

/* Reads a raw image of exactly `size` bytes; 0 if the file does not exist yet. */
static int load_image(const char *path, uint8_t *dest, uint32_t size, const char *what)
{
    FILE *file = fopen(path, "rb");
    if (file == NULL) {
        if (errno == ENOENT) {
            return 0;
        }
        die("cannot read %s image %s: %s", what, path, strerror(errno));
    }
    size_t n = fread(dest, 1, size, file);
    int longer = fgetc(file) != EOF;
    fclose(file);
    if (n != size || longer) {
        die("%s image %s does not hold the %u bytes of this MCU's %s: it belongs to another board", what, path,
            (unsigned)size, what);
    }
    return 1;
}

/* Written to a temporary name and renamed: a reader (or the next start after a crash) never sees half. */
static int save_image(const char *path, const uint8_t *data, uint32_t size)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        return -1;
    }
    FILE *file = fopen(tmp, "wb");
    if (file == NULL) {
        fprintf(stderr, "simuno: cannot write %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    int ok = fwrite(data, 1, size, file) == size;
    ok = (fclose(file) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "simuno: cannot write %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Saves flash and EEPROM if they changed since the last save; returns -1 if a write failed. */
static int board_save(board_t *b)
{
    int status = 0;
    if (b->flash_path != NULL && memcmp(b->flash_saved, b->avr->flash, b->flash_size) != 0) {
        if (save_image(b->flash_path, b->avr->flash, b->flash_size) == 0) {
            memcpy(b->flash_saved, b->avr->flash, b->flash_size);
        } else {
            status = -1;
        }
    }
    if (b->eeprom_path != NULL) {
        uint32_t size;
        uint8_t *ee = eeprom_bytes(b->avr, &size);
        if (ee != NULL && memcmp(b->eeprom_saved, ee, size) != 0) {
            if (save_image(b->eeprom_path, ee, size) == 0) {
                memcpy(b->eeprom_saved, ee, size);
            } else {
                status = -1;
            }
        }
    }
    return status;
}

/* One simuno per state directory: two boards writing the same files would lose uploads. The lock goes with the
 * process (also on kill -9), so no lock file is left behind. */
static void lock_state_dir(const char *path)
{
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", path);
    const char *dir = dirname(copy);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        die("cannot open the state directory %s: %s", dir, strerror(errno));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        die("the state directory %s is in use by another simulated board", dir);
    }
    /* fd stays open (and locked) until exit */
}

static void board_reset(board_t *b, io_state_t *io, uint8_t mcusr_flags)
{
    avr_reset(b->avr); /* clears the I/O registers, MCUSR included; PC = reset_pc (the boot section) */
    b->avr->data[MCUSR_DATA_ADDR] |= mcusr_flags;
    b->halted = 0;
    b->resets++;
    io->xoff = 0;      /* the UART's input FIFO was emptied by the reset */
}

/* What a real CPU does on erased flash (0xFFFF words) or after running off its code: it runs on until it
 * reaches the boot section, registers and I/O untouched, MCUSR as the code left it. Resume at the boot section
 * after the cycles the slide would have taken, so a board without an application loops through its bootloader
 * at the real pace (and can always be flashed). */
static void board_slide_to_boot(board_t *b)
{
    avr_t *avr = b->avr;
    uint32_t pc = avr->pc < b->boot_start ? avr->pc : 0;
    b->crashes++;
    if (g_verbose && b->crashes <= 3u) {
        fprintf(stderr, "simuno: no valid code at pc=0x%05x (cycle %" PRIu64 "): on to the boot section\n",
                (unsigned)avr->pc, (uint64_t)avr->cycle);
    }
    avr->cycle += (b->boot_start - pc) / 2u; /* one cycle per word */
    avr->pc = b->boot_start;
    avr->state = cpu_Running;
}

/* Is a program holding the pty's slave side open? The master reports POLLHUP while nobody does. */
static int client_present(io_state_t *io)
{
    struct pollfd pfd = {io->in_fd, POLLIN, 0};
    if (poll(&pfd, 1, 0) < 0) {
        return 0;
    }
    return (pfd.revents & POLLHUP) == 0;
}

/* Bytes the firmware sends while nobody has the port open are lost, as with a USB bridge; so are bytes the host
 * does not read fast enough (the pty's buffer is full): the simulation must never wait for the host. */
static void board_flush_output(io_state_t *io, int connected)
{
    if (connected && io->out_len > 0) {
        ssize_t n = write(io->out_fd, io->out_buf, io->out_len);
        (void)n;
    }
    io->out_len = 0;
}

static void board_discard_input(io_state_t *io)
{
    io->in_head = 0;
    io->in_len = 0;
    uint8_t scratch[256];
    while (fd_readable(io->in_fd, 0) && read(io->in_fd, scratch, sizeof scratch) > 0) {
    }
}

static void sleep_ns(int64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    nanosleep(&ts, NULL); /* EINTR (a signal) just ends the sleep early */
}

static int run_board(board_t *b, io_state_t *io)
{
    avr_t *avr = b->avr;
    int64_t wall_anchor = now_ns(), last_save = wall_anchor;
    uint64_t cycle_anchor = avr->cycle;
    uint32_t services = 0;
    board_reset(b, io, MCUSR_PORF); /* power on */
    for (;;) {
        if (g_stop_signal) {
            return EXIT_DONE;
        }
        if ((++services & 255u) == 0 && parent_gone(io)) {
            return EXIT_PARENT_GONE;
        }
        int connected = client_present(io);
        if (connected && !b->connected) {
            /* DTR went active: the reset capacitor pulls RESET low. Bytes sent before are lost. */
            board_discard_input(io);
            board_reset(b, io, MCUSR_EXTRF);
            wall_anchor = now_ns();
            cycle_anchor = avr->cycle;
        } else if (!connected && b->connected) {
            io->in_head = io->in_len = 0;
            board_save(b); /* an upload just ended (or was killed): keep what is in flash now */
        }
        b->connected = connected;
        if (connected) {
            read_input(io);
            if (io->in_fd < 0) {
                io->in_fd = io->out_fd; /* EIO from a closing client is not the end of the master */
            }
            uart_feed(avr, io);
        }

        int64_t now = now_ns();
        if (b->halted) {
            sleep_ns(1000000LL); /* nothing runs until a reset; keep watching the port */
            wall_anchor = now_ns();
            cycle_anchor = avr->cycle;
        } else {
            /* A sleeping chip with no timer running advances 1000 cycles a step: 1024 of them were 64 ms simulated,
             * which the pacing below then waited out before looking at the port again, so a request that came
             * while the firmware slept waited for tens of ms. Bounded in simulated time, the port is looked at
             * every 0.1 ms whether the chip computes or sleeps. */
            uint64_t batch_end = avr->cycle + avr->frequency / BOARD_BATCH_PER_SECOND;
            for (uint32_t i = 0; i < BOARD_BATCH_INSTRUCTIONS && avr->cycle < batch_end; ++i) {
                if (avr->pc < b->boot_start && avr->flash[avr->pc] == 0xFFu && avr->flash[avr->pc + 1u] == 0xFFu) {
                    /* Erased flash: simavr would decode 0xFFFF into stray I/O writes; silicon just moves on. */
                    board_slide_to_boot(b);
                    break; /* a slide is up to ms of simulated time: pace and look at the port first */
                }
                int state = simuno_step(avr);
                if (state == cpu_Done) {
                    b->halted = 1;
                    break;
                }
                if (state == cpu_Crashed || state == cpu_Stopped) {
                    board_slide_to_boot(b);
                    break;
                }
            }
            board_flush_output(io, connected);
            /* Pace: simulated time may run ahead of the wall clock by less than a sleep's worth. Sleep in
             * short steps, each followed by a look at the port: an open must never wait behind a long sleep
             * (its bytes would then be discarded as sent before the reset). */
            int64_t sim_ns = (int64_t)((double)(avr->cycle - cycle_anchor) * 1e9 / (double)avr->frequency);
            int64_t wall_ns = now_ns() - wall_anchor;
            while (sim_ns - wall_ns >= BOARD_MIN_SLEEP_NS && !g_stop_signal && client_present(io) == connected) {
                int64_t ahead = sim_ns - wall_ns;
                sleep_ns(ahead < BOARD_MAX_SLEEP_NS ? ahead : BOARD_MAX_SLEEP_NS);
                wall_ns = now_ns() - wall_anchor;
            }
            if (wall_ns - sim_ns > BOARD_MAX_LAG_NS) {
                wall_anchor = now_ns(); /* too slow a host: simulated time slows down, never races */
                cycle_anchor = avr->cycle;
            }
        }
        if (now - last_save >= BOARD_SAVE_PERIOD_NS) {
            board_save(b);
            last_save = now;
        }
    }
}

static int board_main(const options_t *opt, int data_out_fd)
{
    avr_t *avr = avr_make_mcu_by_name(opt->mcu);
    if (avr == NULL) {
        die("unknown MCU '%s'", opt->mcu);
    }
    avr_init(avr);
    widen_data_space(avr);
    avr->log = opt->verbose ? LOG_TRACE : LOG_ERROR;
    avr->frequency = opt->freq;
    avr->sleep = on_avr_sleep; /* libsimavr's default sleeps in host time; run_board() paces instead */

    static board_t board;
    memset(&board, 0, sizeof board);
    board.avr = avr;
    board.flash_size = avr->flashend + 1u;
    board.flash_path = opt->flash_path;
    g_pace_rx = 1;
    board.eeprom_path = opt->eeprom_path;
    if (opt->flash_path != NULL) {
        lock_state_dir(opt->flash_path);
    }
    if (opt->eeprom_path != NULL && opt->flash_path == NULL) {
        lock_state_dir(opt->eeprom_path);
    }
    memset(avr->flash, 0xFF, board.flash_size); /* erased */
    if (opt->flash_path != NULL) {
        load_image(opt->flash_path, avr->flash, board.flash_size, "flash");
    }
    /* The boot section is lock-bit protected on a real board: whatever the image holds, the bootloader is intact. */
    board.boot_start = load_ihex(opt->bootloader_path, avr->flash, board.flash_size);
    avr->reset_pc = board.boot_start;
    avr->codeend = avr->flashend; /* all of flash is code: no "jump outside the firmware" stop */

    uint32_t ee_size = 0;
    uint8_t *ee = eeprom_bytes(avr, &ee_size);
    if (opt->eeprom_path != NULL) {
        if (ee == NULL) {
            die("--eeprom: this MCU has no EEPROM");
        }
        memset(ee, 0xFF, ee_size);
        load_image(opt->eeprom_path, ee, ee_size, "EEPROM");
        board.eeprom_saved = malloc(ee_size);
        if (board.eeprom_saved == NULL) {
            die("out of memory");
        }
        memcpy(board.eeprom_saved, ee, ee_size);
    }
    board.flash_saved = malloc(board.flash_size);
    if (board.flash_saved == NULL) {
        die("out of memory");
    }
    /* Not yet saved: a fresh board writes its (erased + bootloader) flash at the first save. */
    memset(board.flash_saved, 0, board.flash_size);
    if (opt->flash_path != NULL && access(opt->flash_path, F_OK) == 0) {
        memcpy(board.flash_saved, avr->flash, board.flash_size);
    }

    memset(&g_io, 0, sizeof g_io);
    connect_uart(avr, &g_io);
    g_io.pty_slave_fd = -1;
    g_io.markers = NULL;
    /* The master alone: nobody holds the slave, so a program opening it is seen (POLLHUP clears). */
    int slave = -1;
    int master = open_pty(data_out_fd, &slave);
    close(slave);
    close(data_out_fd);
    g_io.in_fd = master;
    g_io.out_fd = master;
    g_io.parent_fd = opt->parent_pipe ? STDIN_FILENO : -1;

    int status = run_board(&board, &g_io);
    if (board_save(&board) != 0) {
        status = EXIT_USAGE;
    }
    if (g_verbose) {
        fprintf(stderr, "simuno: board stopped at cycle %" PRIu64 " after %" PRIu64 " resets, %" PRIu64
                " slides to the boot section\n", (uint64_t)avr->cycle, board.resets, board.crashes);
    }
    avr_terminate(avr);
    return status;
}

int main(int argc, char **argv)
{
    /* stdout is a data channel (UART bytes, or the PTY line): keep it private and send fd 1 -- where
     * libsimavr may print -- to stderr before anything else runs. */
    int data_out_fd = dup(STDOUT_FILENO);
    if (data_out_fd < 0) {
        perror("simuno: dup(stdout)");
        return EXIT_USAGE;
    }
    dup2(STDERR_FILENO, STDOUT_FILENO);

    options_t opt = parse_options(argc, argv);
    g_verbose = opt.verbose;
    /* Another libsimavr version steps differently (later ones track sei's one-instruction delay themselves):
     * it gets its own avr_run. SIMUNO_LIBRARY_STEP=1 asks for the library's step anyway, so a test can check
     * that both simulate the same cycles (tests/test_simulator.py). */
    g_inline_step = strcmp(CONFIG_SIMAVR_VERSION, "1.6") == 0 && getenv("SIMUNO_LIBRARY_STEP") == NULL;
    if (g_verbose) {
        fprintf(stderr, "simuno: libsimavr %s, %s step\n", CONFIG_SIMAVR_VERSION, g_inline_step ? "inline" : "library");
    }
    avr_global_logger_set(sim_logger);
    install_signal_handlers();
    if (opt.bootloader_path != NULL) {
        return board_main(&opt, data_out_fd);
    }

    avr_t *avr = load_avr(&opt);
    if (opt.eeprom_path != NULL) {
        eeprom_load(avr, opt.eeprom_path);
    }
    memset(&g_io, 0, sizeof g_io);
    connect_uart(avr, &g_io);
    if (opt.markers_path != NULL || opt.markers_fd >= 0) {
        avr_register_io_write(avr, GPIOR0_DATA_ADDR, on_gpior0_write, &g_io);
    }
    open_host_side(&opt, &g_io, data_out_fd);

    int status = simulate(avr, &g_io, opt.timeout_cycles);
    if (opt.eeprom_path != NULL && eeprom_save(avr, opt.eeprom_path) != 0 && status == EXIT_DONE) {
        status = EXIT_USAGE;
    }
    avr_terminate(avr);
    return status;
}
