// burst sends -n copies of one AdmissionReview at once through one http.Transport, -rounds times,
// and prints each answer's status and seconds as JSON. It calls a webhook the way the
// kube-apiserver's webhook client (a Go http.Transport over HTTP/1.1 and TLS) does: a request
// that finds no idle connection dials a new one, a request whose dial is slow takes a connection
// freed meanwhile, and the new connection, its TLS handshake done, waits idle in the pool
// (MaxIdleConnsPerHost 25, as the apiserver's transport keeps; the rest are closed).
// Standard library only (bench/flood.py builds it with `go build`).
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"io"
	"log"
	"net/http"
	"os"
	"sync"
	"time"
)

type answer struct {
	Status  int     `json:"status"`
	Seconds float64 `json:"seconds"`
	Error   string  `json:"error,omitempty"`
}

func main() {
	url := flag.String("url", "", "the webhook URL")
	ca := flag.String("ca", "", "PEM file of the CA that signed the server's certificate")
	body := flag.String("body", "", "file with the AdmissionReview to send")
	n := flag.Int("n", 200, "reviews at once")
	rounds := flag.Int("rounds", 1, "bursts, 0.5 s apart, over the same transport")
	timeout := flag.Duration("timeout", 10*time.Second, "client timeout per review")
	flag.Parse()
	pem, err := os.ReadFile(*ca)
	if err != nil {
		log.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	data, err := os.ReadFile(*body)
	if err != nil {
		log.Fatal(err)
	}
	transport := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: 25}
	client := &http.Client{Transport: transport, Timeout: *timeout}
	out := [][]answer{}
	for r := 0; r < *rounds; r++ {
		answers := make([]answer, *n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := 0; i < *n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				<-start
				t := time.Now()
				resp, err := client.Post(*url, "application/json", bytes.NewReader(data))
				if err != nil {
					answers[i] = answer{Seconds: time.Since(t).Seconds(), Error: err.Error()}
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answers[i] = answer{Status: resp.StatusCode, Seconds: time.Since(t).Seconds()}
			}(i)
		}
		close(start)
		wg.Wait()
		out = append(out, answers)
		time.Sleep(500 * time.Millisecond)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		log.Fatal(err)
	}
}
