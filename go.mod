module github.com/ratelimitd/ratelimitd

go 1.26.0
