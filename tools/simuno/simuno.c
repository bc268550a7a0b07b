/* simuno: a cycle-exact simulated Arduino Uno (ATmega328P) that behaves like a serial port.
 *
 *   simuno [--pty | --stdio] [--markers FILE] [--timeout-cycles N] [--mcu atmega328p] [--freq 16000000]
 *          [--parent-pipe] [--eeprom FILE] [-v] firmware.elf
 *
 * UART0 is connected either to a fresh pseudo-terminal (--pty, the default: prints exactly one line
 * "PTY /dev/pts/N" on stdout, then a program opens that path like a USB serial port) or to
 * stdin/stdout (--stdio, binary clean, for `pio test` and pipes). Every write to GPIOR0 is a marker:
 * "<value> <cycle>" goes to --markers FILE, one flushed line per write, where <cycle> is avr->cycle at
 * the start of the OUT/STS instruction (so the difference of two markers is an exact cycle count).
 *
 * --parent-pipe (with --pty): stdin is a pipe from the parent process; when it reaches EOF (the parent closed
 * it, or died however abruptly) simuno exits, so no simulator outlives the program that started it.
 *
 * --eeprom FILE: the MCU's EEPROM persists in FILE, a raw image (1024 bytes on the ATmega328P). It is loaded at
 * start if it exists (a shorter file fills the start, the rest stays erased, 0xFF) and written back whenever
 * simuno stops (also on SIGTERM and when the parent pipe closes), so a restart is like a power cycle.
 * Without it the EEPROM starts erased and is forgotten, as before.
 *
 * Exit status: 0 the firmware slept with interrupts disabled (its way of saying "done"); 1 usage or
 * load error; 2 the simulated CPU crashed; 3 --timeout-cycles reached; 4 the --parent-pipe closed;
 * 128+signo on SIGTERM/SIGINT/SIGHUP.
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
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <simavr/avr_eeprom.h>
#include <simavr/avr_uart.h>
#include <simavr/sim_avr.h>
#include <simavr/sim_elf.h>
#include <simavr/sim_irq.h>

#define EXIT_DONE 0
#define EXIT_USAGE 1
#define EXIT_CRASH 2
#define EXIT_TIMEOUT 3
#define EXIT_PARENT_GONE 4

#define GPIOR0_DATA_ADDR 0x3E   /* I/O 0x1E + 0x20: the marker register */
#define UCSR0B_DATA_ADDR 0xC1
#define RXEN0_BIT 4

#define BATCH_INSTRUCTIONS 4096u  /* instructions run between two host I/O services (~50 us of host time) */
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
    int xoff;            /* the UART's input FIFO is full: do not push (the byte would be dropped) */
    uint32_t rx_polls;   /* firmware read UCSR0A/UDR0 with an empty FIFO (XON pulses) in this batch */
    uint32_t bytes_moved;/* bytes in either direction in this batch */
    avr_t *avr;
    avr_irq_t *uart_irq; /* base of UART0's IRQs (INPUT, OUTPUT, XON, XOFF) */
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
    fputs("usage: simuno [--pty | --stdio] [--markers FILE] [--timeout-cycles N] [--mcu atmega328p]\n"
          "              [--freq 16000000] [--parent-pipe] [--eeprom FILE] [-v] firmware.elf\n",
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
    options_t opt = {1, NULL, 0, "atmega328p", 16000000u, 0, 0, NULL, NULL};
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
    if (opt.elf_path == NULL) {
        usage();
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

/* Writes everything or gives up when the reader is gone; waits (interruptibly) while the pipe is full. */
static void write_all(io_state_t *io, const uint8_t *data, size_t len)
{
    while (len > 0 && io->out_fd >= 0) {
        ssize_t n = write(io->out_fd, data, len);
        if (n > 0) {
            data += n;
            len -= (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            if (g_stop_signal) {
                return;
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
}

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
/* UART0 <-> host bytes, respecting the UART's XON/XOFF so no byte is dropped                        */

static int uart_rx_enabled(avr_t *avr)
{
    return (avr->data[UCSR0B_DATA_ADDR] >> RXEN0_BIT) & 1u;
}

/* Pushes pending host bytes into the UART's input FIFO until it reports full (XOFF) or we run out.
 * The UART itself paces delivery to the firmware at the configured baud rate. */
static void uart_feed(avr_t *avr, io_state_t *io)
{
    while (io->in_len > 0 && !io->xoff && uart_rx_enabled(avr)) {
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
    if (io->out_len == IO_BUF_SIZE) {
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
    /* The command line wins over an optional .mmcu section: the Uno is the point of this tool. */
    snprintf(fw.mmcu, sizeof fw.mmcu, "%s", opt->mcu);
    fw.frequency = opt->freq;
    avr_t *avr = avr_make_mcu_by_name(fw.mmcu);
    if (avr == NULL) {
        die("unknown MCU '%s'", opt->mcu);
    }
    avr_init(avr);
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
    avr_ioctl(avr, AVR_IOCTL_UART_SET_FLAGS('0'), &flags);
    io->avr = avr;
    io->uart_irq = avr_io_getirq(avr, AVR_IOCTL_UART_GETIRQ('0'), 0);
    if (io->uart_irq == NULL) {
        die("this MCU has no UART0");
    }
    avr_irq_register_notify(io->uart_irq + UART_IRQ_OUTPUT, on_uart_output, io);
    avr_irq_register_notify(io->uart_irq + UART_IRQ_OUT_XON, on_uart_xon, io);
    avr_irq_register_notify(io->uart_irq + UART_IRQ_OUT_XOFF, on_uart_xoff, io);
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

static int finish(avr_t *avr, io_state_t *io, int status)
{
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

/* Runs up to BATCH_INSTRUCTIONS instructions; returns the CPU state afterwards. */
static int run_batch(avr_t *avr, uint64_t timeout_cycles)
{
    int state = avr->state;
    for (uint32_t i = 0; i < BATCH_INSTRUCTIONS; ++i) {
        state = avr_run(avr);
        if (state == cpu_Done || state == cpu_Crashed || state == cpu_Stopped) {
            break;
        }
        if (timeout_cycles != 0 && avr->cycle >= timeout_cycles) {
            break;
        }
    }
    return state;
}

static int simulate(avr_t *avr, io_state_t *io, uint64_t timeout_cycles)
{
    uint64_t idle_cycles = 0;
    uint32_t batches = 0;
    for (;;) {
        uint64_t batch_start = avr->cycle;
        io->rx_polls = 0;
        io->bytes_moved = 0;
        g_slept_in_batch = 0;

        int state = run_batch(avr, timeout_cycles);
        flush_output(io);
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

        /* Idle = no byte moved and the firmware either slept or kept polling an empty receiver (a dense
         * stream of XON pulses; a computation that peeks at the UART now and then is not idle). */
        int polling = io->rx_polls >= BATCH_INSTRUCTIONS / 32u && io->in_len == 0;
        int idle = io->bytes_moved == 0 && (polling || g_slept_in_batch);
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
    avr_global_logger_set(sim_logger);
    install_signal_handlers();

    avr_t *avr = load_avr(&opt);
    if (opt.eeprom_path != NULL) {
        eeprom_load(avr, opt.eeprom_path);
    }
    memset(&g_io, 0, sizeof g_io);
    connect_uart(avr, &g_io);
    if (opt.markers_path != NULL) {
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
