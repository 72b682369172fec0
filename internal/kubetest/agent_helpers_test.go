package kubetest_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// helperArg, as the first argument of the test binary, makes it a pod's program instead of
// running the tests: the agent tests run pods of the image helperImage, which is this binary.
const helperArg = "kubetest-helper"

// Exit codes of the helper's modes, besides 0.
const (
	exitFailed    = 1 // the mode's work failed
	exitUsage     = 2 // unknown mode or bad arguments
	exitForbidden = 3 // list-pods: the apiserver said Forbidden
)

// runHelper runs one helper mode, args[0], and returns the process's exit code. Every mode
// prints what it does on stdout, which the agent keeps as the pod's log.
//
//	exit N                 exit with code N
//	env ARGS...            print each argument and the sorted environment, then exit 0
//	serve ADDR             serve TCP on ADDR: each line read is answered "hello HOSTNAME";
//	                       "quit" is answered "bye" and ends the program with 0; SIGTERM prints
//	                       "term" and ends it with 0
//	serve-ignoring ADDR    the same, but SIGTERM is ignored
//	sleep                  wait for SIGTERM, print "term", exit 0
//	touch MIB              map and touch MIB MiB of memory, exit 0
//	dial HOST PORT         resolve HOST, connect to it, say "hi" and print the answer
//	list-pods              list the pods of its namespace with rest.InClusterConfig
//	fail-once DIR ADDR     first run (no DIR/marker): make the marker and exit 1; later: serve ADDR
//	write FILE TEXT        write TEXT in FILE, then print the size and type of its filesystem
//	read FILE              print FILE's content
func runHelper(args []string) int {
	if len(args) == 0 {
		fmt.Println("helper: no mode")
		return exitUsage
	}
	mode, args := args[0], args[1:]
	arg := func(i int) string {
		if i < len(args) {
			return args[i]
		}
		return ""
	}
	switch mode {
	case "exit":
		code, err := strconv.Atoi(arg(0))
		if err != nil {
			return exitUsage
		}
		fmt.Println("exiting with", code)
		return code
	case "env":
		printEnv(args)
		return 0
	case "serve", "serve-ignoring":
		printEnv(args)
		return serve(arg(0), mode == "serve-ignoring")
	case "sleep":
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		fmt.Println("sleeping")
		<-term
		fmt.Println("term")
		return 0
	case "touch":
		mib, err := strconv.Atoi(arg(0))
		if err != nil {
			return exitUsage
		}
		if err := touchMiB(mib); err != nil {
			fmt.Println("touch:", err)
			return exitFailed
		}
		fmt.Printf("touched %d MiB\n", mib)
		return 0
	case "dial":
		return dial(arg(0), arg(1))
	case "list-pods":
		return listPods()
	case "fail-once":
		marker := filepath.Join(arg(0), "marker")
		if _, err := os.Stat(marker); errors.Is(err, os.ErrNotExist) {
			if err := os.WriteFile(marker, nil, 0o644); err != nil {
				fmt.Println("marker:", err)
				return exitUsage
			}
			fmt.Println("failing once")
			return exitFailed
		}
		fmt.Println("found the marker")
		return serve(arg(1), false)
	case "write":
		if err := os.WriteFile(arg(0), []byte(arg(1)), 0o644); err != nil {
			fmt.Println("write:", err)
			return exitFailed
		}
		fmt.Println("wrote", arg(0))
		size, fsType, err := filesystem(filepath.Dir(arg(0)))
		if err != nil {
			fmt.Println("statfs:", err)
			return exitFailed
		}
		fmt.Printf("filesystem size=%d type=%#x\n", size, fsType)
		return 0
	case "read":
		b, err := os.ReadFile(arg(0))
		if err != nil {
			fmt.Println("read:", err)
			return exitFailed
		}
		fmt.Printf("read %s: %s\n", arg(0), b)
		return 0
	}
	fmt.Println("helper: unknown mode", mode)
	return exitUsage
}

// printEnv prints the arguments, the host name and the environment, one per line.
func printEnv(args []string) {
	for i, a := range args {
		fmt.Printf("arg[%d]=%s\n", i, a)
	}
	host, _ := os.Hostname()
	fmt.Printf("hostname=%s\n", host)
	env := os.Environ()
	slices.Sort(env)
	for _, e := range env {
		fmt.Println("env", e)
	}
}

func serve(addr string, ignoreTerm bool) int {
	term := make(chan os.Signal, 1)
	if ignoreTerm {
		signal.Ignore(syscall.SIGTERM)
	} else {
		signal.Notify(term, syscall.SIGTERM)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Println("listen:", err)
		return exitFailed
	}
	fmt.Println("listening on", l.Addr())
	quit := make(chan struct{}, 1)
	host, _ := os.Hostname()
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				s := bufio.NewScanner(conn)
				for s.Scan() {
					if s.Text() == "quit" {
						fmt.Fprintln(conn, "bye")
						quit <- struct{}{}
						return
					}
					fmt.Fprintln(conn, "hello", host)
				}
			}()
		}
	}()
	select {
	case <-quit:
		fmt.Println("quit")
	case <-term:
		fmt.Println("term")
	}
	return 0
}

func dial(host, port string) int {
	addrs, err := net.LookupHost(host)
	if err != nil {
		fmt.Println("lookup:", err)
		return exitFailed
	}
	fmt.Println("resolved", host, "to", addrs)
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(host, port), 10*time.Second)
	if err != nil {
		fmt.Println("dial:", err)
		return exitFailed
	}
	defer conn.Close()
	fmt.Fprintln(conn, "hi")
	answer, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		fmt.Println("read:", err)
		return exitFailed
	}
	fmt.Print("answer: ", answer)
	return 0
}

func listPods() int {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		fmt.Println("in-cluster config:", err)
		return exitFailed
	}
	ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		fmt.Println("namespace:", err)
		return exitFailed
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Println("client:", err)
		return exitFailed
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := client.CoreV1().Pods(strings.TrimSpace(string(ns))).List(ctx, metav1.ListOptions{})
	if apierrors.IsForbidden(err) {
		fmt.Println("forbidden:", err)
		return exitForbidden
	}
	if err != nil {
		fmt.Println("list:", err)
		return exitFailed
	}
	fmt.Printf("listed %d pods in %s\n", len(pods.Items), ns)
	return 0
}
